//! This process's executor identity: the owner name on its leases.
//!
//! An identity set explicitly (`KEIRO_EXECUTOR_ID`, [`crate::KeiroBuilder::executor_id`])
//! is exclusive: a second live process asking for it is refused. The default
//! identity is `{host}/{program}`, and when a live process holds it the next
//! free of `{host}/{program}#2`, `#3`, … up to [`MAX_SLOTS`] is taken, so any
//! number of processes run side by side on one host with no setting.
//!
//! Takeovers: a slot whose holder is a dead process on this host is taken at
//! once, with its leases (made due now); one whose holder stopped
//! heartbeating for [`EXECUTOR_TTL`] (a process on another host) is taken
//! after that. A holder on this host whose process is still there keeps its
//! identity however long its heartbeat has been silent (it may be frozen,
//! stopped or starved, with runs whose leases are live: a taker, whose
//! claims take leases of its own name, would run them beside it), up to
//! [`ALIVE_SILENCE_LIMIT`]. A process taking a default slot also releases the leases of
//! every other slot of its program whose holder died on this host, so a
//! restart after several processes were killed resumes all their work at
//! once, not only that of the slot it lands on.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use keiro_store::{now_us, ExecutorRow, Store};
use tokio::sync::watch;

use crate::runtime::Inner;
use crate::time::duration_us;
use crate::{Error, Keiro, Result};

/// An identity whose holder has not sent a heartbeat for this long is free.
pub(crate) const EXECUTOR_TTL: Duration = Duration::from_secs(10);

/// How long a holder on this host whose process is still there may be
/// silent before its identity is free: far past any lease its runs could
/// hold, so that only a process id the system reused for another program
/// frees it (that cannot be told apart without procfs's start times).
const ALIVE_SILENCE_LIMIT: Duration = Duration::from_secs(3600);

/// How long a heartbeat waits for its reading of the server's clock.
const CLOCK_READING: Duration = Duration::from_secs(1);

/// How many default identities (`{host}/{program}`, then `#2` …) one program
/// may hold on one host at once.
pub(crate) const MAX_SLOTS: u32 = 64;

/// The identity this runtime took and the token proving it holds it.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(crate) id: String,
    pub(crate) token: String,
}

impl Keiro {
    /// Takes this runtime's executor identity (once): see the module docs for
    /// which identity and what it takes over. Refused once the runtime is
    /// shut down.
    pub(crate) async fn ensure_executor(&self) -> Result<()> {
        if *self.inner.stop.borrow() {
            return Err(Error::ShutDown {
                executor: self.owner().to_owned(),
            });
        }
        self.inner
            .executor
            .get_or_try_init(|| register(self))
            .await
            .map(|_| ())
    }

    /// The token proving this runtime holds its executor identity, once it
    /// took one.
    pub(crate) fn executor_token(&self) -> Option<&str> {
        self.inner
            .executor
            .get()
            .map(|registration| registration.token.as_str())
    }

    /// The owner name on this runtime's leases: the identity it took, or
    /// before it took one, the identity it asks for first.
    pub(crate) fn owner(&self) -> &str {
        match self.inner.executor.get() {
            Some(registration) => &registration.id,
            None => &self.inner.requested_id,
        }
    }
}

/// Who holds an identity, as seen from this process.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    /// A live process (or one elsewhere still heartbeating).
    Live,
    /// A process on this host that is gone: take over at once.
    DeadHere,
    /// Silent for [`EXECUTOR_TTL`]: free.
    Stale,
}

/// This process, as it registers.
struct Me {
    token: String,
    host: String,
    pid: i64,
}

impl Me {
    fn row(&self, id: &str) -> ExecutorRow {
        ExecutorRow {
            id: id.to_owned(),
            token: self.token.clone(),
            host: self.host.clone(),
            pid: self.pid,
            heartbeat_at: now_us(),
        }
    }

    fn judge(&self, old: &ExecutorRow) -> Holder {
        let silent_since = |limit: Duration| old.heartbeat_at < now_us() - duration_us(limit);
        if old.host == self.host && old.pid != self.pid {
            match pid_alive(old.pid) {
                Some(false) => return Holder::DeadHere,
                // Another process under the holder's pid (a restarted
                // container's, whose pids start over): the holder is gone.
                Some(true) if started_after(old.pid, old.heartbeat_at) => return Holder::DeadHere,
                Some(true) if !silent_since(ALIVE_SILENCE_LIMIT) => return Holder::Live,
                // Without procfs: the heartbeat decides, as elsewhere.
                Some(true) | None => {}
            }
        }
        if silent_since(EXECUTOR_TTL) {
            Holder::Stale
        } else {
            Holder::Live
        }
    }
}

async fn register(keiro: &Keiro) -> Result<Registration> {
    let store = &keiro.inner.store;
    // Before taking anything over: a process whose clock is off would take
    // leases that are not lapsed.
    keiro
        .check_clock_at_start(&keiro.inner.requested_id)
        .await?;
    let me = Me {
        token: uuid::Uuid::new_v4().to_string(),
        host: host_name(),
        pid: i64::from(std::process::id()),
    };
    let requested = keiro.inner.requested_id.as_str();
    let id = if keiro.inner.exclusive {
        take_exclusive(store, requested, &me).await?
    } else {
        take_default(store, requested, &me).await?
    };
    let reclaimed = store.reclaim_own(&id).await?;
    if reclaimed > 0 {
        tracing::info!(executor = %id, reclaimed, "keiro reclaimed a predecessor's leases");
    }
    tokio::spawn(heartbeat(
        Arc::downgrade(&keiro.inner),
        id.clone(),
        me.token.clone(),
        keiro.inner.stop.subscribe(),
    ));
    Ok(Registration {
        id,
        token: me.token,
    })
}

/// Takes an explicitly named identity, refusing if a live process holds it.
async fn take_exclusive(store: &Store, id: &str, me: &Me) -> Result<String> {
    for _ in 0..5 {
        let replacing = match store.get_executor(id).await? {
            None => None,
            Some(old) if me.judge(&old) == Holder::Live => {
                return Err(Error::ExecutorIdInUse {
                    id: id.to_owned(),
                    host: old.host,
                    pid: old.pid,
                })
            }
            Some(old) => Some(old.token),
        };
        if store
            .put_executor(&me.row(id), replacing.as_deref())
            .await?
        {
            return Ok(id.to_owned());
        }
    }
    Err(Error::NoExecutorId {
        reason: format!("other processes keep taking `{id}`"),
    })
}

/// Takes the first default slot of `base` that no live process holds, then
/// releases the leases of the other slots whose holders died on this host.
async fn take_default(store: &Store, base: &str, me: &Me) -> Result<String> {
    let family: HashMap<String, ExecutorRow> = store
        .list_executors(base)
        .await?
        .into_iter()
        .map(|row| (row.id.clone(), row))
        .collect();
    for n in 1..=MAX_SLOTS {
        let id = slot_id(base, n);
        let replacing = match family.get(&id) {
            None => None,
            Some(old) if me.judge(old) == Holder::Live => continue,
            Some(old) => Some(old.token.as_str()),
        };
        // A lost race means another process took this slot just now: it is
        // live, so look further.
        if store.put_executor(&me.row(&id), replacing).await? {
            adopt_dead_siblings(store, &family, &id, me).await;
            return Ok(id);
        }
    }
    Err(Error::NoExecutorId {
        reason: format!(
            "all {MAX_SLOTS} default identities `{base}` … `{base}#{MAX_SLOTS}` are held by \
             live processes; set KEIRO_EXECUTOR_ID to give this process its own"
        ),
    })
}

/// The `n`th default identity of `base`: `base` itself, then `base#2`, ….
fn slot_id(base: &str, n: u32) -> String {
    if n == 1 {
        base.to_owned()
    } else {
        format!("{base}#{n}")
    }
}

/// Removes the slots of `family` (other than `taken`) whose holder died on
/// this host, releasing their leases so any worker resumes that work now
/// instead of after the lease TTL. Best effort: a failure only costs latency.
async fn adopt_dead_siblings(
    store: &Store,
    family: &HashMap<String, ExecutorRow>,
    taken: &str,
    me: &Me,
) {
    for old in family.values() {
        if old.id == taken || me.judge(old) != Holder::DeadHere {
            continue;
        }
        // Conditional on the dead holder's token: a process taking that slot
        // at the same moment wins or loses as a whole.
        match store.remove_executor(&old.id, &old.token).await {
            Ok(Some(released)) => tracing::info!(
                executor = %old.id, released, by = %taken,
                "keiro released the leases of a dead process on this host"
            ),
            Ok(None) => {}
            Err(error) => tracing::warn!(
                executor = %old.id, %error,
                "keiro could not release a dead process's leases; they lapse after the lease TTL"
            ),
        }
    }
}

/// Refreshes the identity until the runtime is dropped or shut down.
async fn heartbeat(inner: Weak<Inner>, id: String, token: String, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(EXECUTOR_TTL / 4);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        match inner.store.heartbeat_executor(&id, &token).await {
            Ok(true) => {}
            // Removed by this runtime's own shutdown meanwhile.
            Ok(false) if *stop.borrow() => return,
            Ok(false) => {
                tracing::error!(
                    executor = %id,
                    "keiro executor identity was taken over by another process"
                );
                return;
            }
            Err(error) => tracing::warn!(%error, "keiro executor heartbeat failed; retrying"),
        }
        let keiro = Keiro { inner };
        keiro.warn_of_starved_runs();
        // After the heartbeat, and bounded, so that a slow reading delays
        // the next heartbeat by a second at most (a timed-out reading leaves
        // the last verdict standing).
        let _ = tokio::time::timeout(CLOCK_READING, keiro.recheck_clock(&id)).await;
    }
}

impl Keiro {
    /// Warns, once per run, of each live run whose lease went unrenewed
    /// past its TTL while it is driven (see [`crate::context::lease_watch`]).
    fn warn_of_starved_runs(&self) {
        let ttl = self.lease_ttl();
        let now = tokio::time::Instant::now();
        for cx in self.inflight().live_runs() {
            if let Some(silent) = cx.lease.starved_once(ttl, now) {
                tracing::warn!(
                    workflow = %cx.name,
                    id = %cx.id,
                    "keiro: this run has not renewed its lease for {silent:.1?}, past its TTL of \
                     {ttl:?}, and another worker may take the instance over and run its steps \
                     again. Its task is not being polled: most likely a step body blocks the \
                     async runtime's thread (std::thread::sleep, blocking I/O, a long \
                     computation; run it in tokio::task::spawn_blocking), or a transactional \
                     step has held its transaction that long"
                );
            }
        }
    }
}

/// `{host}/{program}`: shared by the processes of one program on one host,
/// each taking a numbered slot of it.
pub(crate) fn default_executor_id() -> String {
    let program = std::env::current_exe()
        .ok()
        .or_else(|| std::env::args_os().next().map(Into::into))
        .and_then(|path| {
            path.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .filter(|stem| !stem.is_empty())
        .unwrap_or_else(|| "keiro".to_owned());
    format!("{}/{program}", host_name())
}

/// This machine's host name.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "keiro".to_owned())
}

/// Whether process `pid` of this host started after `at_us` (µs since the
/// Unix epoch), by more than the readings' resolution: then it is not the
/// process that heartbeat at `at_us`. `false` when procfs cannot tell.
fn started_after(pid: i64, at_us: i64) -> bool {
    /// Beyond the jiffy and centisecond the readings round to.
    const SLACK_US: i64 = 100_000;
    process_started_us(pid).is_some_and(|started| started > at_us.saturating_add(SLACK_US))
}

/// When process `pid` of this host started (µs since the Unix epoch), from
/// procfs: its start in clock ticks after boot (`/proc/PID/stat`, field 22)
/// against the time since boot (`/proc/uptime`), both of the host's boot
/// in a container too.
fn process_started_us(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis, from the third.
    let (_, rest) = stat.rsplit_once(')')?;
    let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let uptime_s: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let age_s = uptime_s - start_ticks / ticks;
    Some(now_us() - (age_s * 1e6) as i64)
}

/// Whether process `pid` of this host is there (stopped counts, a zombie
/// does not); `None` without procfs, where it cannot be told.
fn pid_alive(pid: i64) -> Option<bool> {
    let proc_root = std::path::Path::new("/proc");
    if !proc_root.join("self").exists() {
        return None;
    }
    let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
        return Some(false);
    };
    // A zombie (state Z) is dead for our purposes.
    Some(
        stat.rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
    )
}

#[cfg(test)]
mod tests {
    use super::{duration_us, now_us, slot_id, ExecutorRow, Holder, Me, ALIVE_SILENCE_LIMIT};

    /// This process, registering as another of its host would.
    fn me() -> Me {
        Me {
            token: "new".into(),
            host: "h".into(),
            pid: i64::from(std::process::id()) + 1,
        }
    }

    /// A holder on host `h`, process `pid`, last heard of at `heartbeat_at`.
    fn holder(pid: i64, heartbeat_at: i64) -> ExecutorRow {
        ExecutorRow {
            id: "h/app".into(),
            token: "old".into(),
            host: "h".into(),
            pid,
            heartbeat_at,
        }
    }

    /// A holder on this host whose process is still there (frozen or
    /// stopped, say) keeps its identity past the heartbeat TTL: its runs
    /// may hold live leases, which a taker would claim as its own and run
    /// beside it. Only a silence far past any lease frees it. A holder
    /// whose process is gone is taken at once, and so is one whose pid
    /// names a process that started after the holder last heartbeat (a
    /// restarted container's pids start over).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_silent_holder_whose_process_is_there_keeps_its_identity() {
        let second = 1_000_000;
        // The system's first process: there since before any heartbeat here.
        let init = super::process_started_us(1).expect("procfs reads pid 1");
        let silent = now_us() - 12 * second;
        assert!(init < silent, "pid 1 started within the last 12 s");
        assert_eq!(me().judge(&holder(1, silent)), Holder::Live);
        let long_ago = now_us() - duration_us(ALIVE_SILENCE_LIMIT) - 60 * second;
        assert_ne!(me().judge(&holder(1, long_ago)), Holder::Live);
        // Heard of before pid 1 started: pid 1 is another process.
        assert_eq!(me().judge(&holder(1, init - 2 * second)), Holder::DeadHere);
        // Beyond `pid_max`: no such process.
        assert_eq!(me().judge(&holder(1 << 23, now_us())), Holder::DeadHere);
        let mut elsewhere = holder(1, silent);
        elsewhere.host = "other".into();
        assert_eq!(me().judge(&elsewhere), Holder::Stale);
    }

    #[test]
    fn the_first_slot_is_the_base_and_later_ones_are_numbered() {
        assert_eq!(slot_id("h/app", 1), "h/app");
        assert_eq!(slot_id("h/app", 2), "h/app#2");
        assert_eq!(slot_id("h/app", 64), "h/app#64");
    }
}
