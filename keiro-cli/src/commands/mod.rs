//! One module per group of commands; [`dispatch`] picks the one asked for.

mod check;
mod gc;
mod instances;
mod messages;
mod repair;
mod schedules;
pub(crate) mod schema;
mod serve;
mod timers;
mod versions;

use keiro::Keiro;

use crate::args::Command;
use crate::{Failure, Report};

/// Runs `command` on `keiro` (`migrate` is run before connecting, by
/// [`schema::migrate`]).
pub(crate) async fn dispatch(keiro: &Keiro, command: Command) -> Result<Report, Failure> {
    match command {
        Command::List(args) => instances::list(keiro, &args).await,
        Command::Show {
            id, history: false, ..
        } => instances::show(keiro, &id).await,
        Command::Show { id, out, .. } => instances::history(keiro, &id, out.as_deref()).await,
        Command::Cancel { id } => repair::cancel(keiro, &id).await,
        Command::Retry { id } => repair::retry(keiro, &id).await,
        Command::Resume { id } => repair::resume(keiro, &id).await,
        Command::Fork { id, from, new_id } => {
            repair::fork(keiro, &id, from, new_id.as_deref()).await
        }
        Command::Resolve {
            awakeable_id,
            value,
        } => messages::resolve(keiro, &awakeable_id, value).await,
        Command::Reject {
            awakeable_id,
            reason,
        } => messages::reject(keiro, &awakeable_id, &reason).await,
        Command::Send {
            id,
            topic,
            value,
            idempotency_key,
        } => messages::send(keiro, &id, &topic, &value, idempotency_key).await,
        Command::Timers(command) => timers::run(keiro, command).await,
        Command::Schedules { action } => schedules::run(keiro, action).await,
        Command::Gc(args) => gc::run(keiro, &args).await,
        Command::Serve(args) => serve::run(keiro, &args).await,
        Command::Versions => versions::list(keiro).await,
        Command::Check { binary_hashes } => check::run(keiro, &binary_hashes).await,
        Command::Retarget { from, to } => versions::retarget(keiro, &from, &to).await,
        Command::Migrate => Err(Failure::Usage(
            "`keiro migrate` runs before connecting; this is a bug in the keiro command".into(),
        )),
    }
}
