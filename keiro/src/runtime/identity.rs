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
//! after that. A holder on this host whose process is still there (its
//! token names the process: see [`Process`]) keeps its identity however
//! long its heartbeat has been silent (it may be frozen, stopped or
//! starved, with runs whose leases are live: a taker, whose claims take
//! leases of its own name, would run them beside it), up to
//! [`ALIVE_SILENCE_LIMIT`]; one whose pid now names another process, or
//! whose host restarted since, is dead. A process taking a default slot also releases the leases of
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
/// hold (such a process has stopped for good, or dropped its runtime
/// without shutting it down).
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
    /// Unique to this registration, and naming this process when procfs
    /// can (see [`Process`]).
    token: String,
    host: String,
    pid: i64,
    /// This process as procfs tells it apart, if it can.
    process: Option<Process>,
}

/// One process of one boot of a host: its pid is reused by later processes
/// (a restarted container's pids start over), its start time since boot
/// is not. A holder's token carries it (`{uuid}@{boot id}@{start ticks}`),
/// so a process judging the holder knows whether the pid still names it,
/// with no clock involved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Process {
    /// `/proc/sys/kernel/random/boot_id`: new at each boot of the host.
    boot: String,
    /// When the process started, in clock ticks since boot
    /// (`/proc/PID/stat`, field 22).
    start_ticks: u64,
}

impl Process {
    /// Process `pid` (a number, or `self`) of this host, as procfs tells
    /// it, if it is there (a zombie is not).
    fn of(pid: &str) -> Option<Process> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some(Process {
            boot: boot.trim().to_owned(),
            start_ticks: start_ticks(&stat)?,
        })
    }

    /// The process a registration's token names, if it names one.
    fn in_token(token: &str) -> Option<Process> {
        let mut parts = token.split('@');
        let (_, boot, ticks) = (parts.next()?, parts.next()?, parts.next()?);
        Some(Process {
            boot: boot.to_owned(),
            start_ticks: ticks.parse().ok()?,
        })
    }
}

/// The start time in clock ticks since boot in a `/proc/PID/stat` line
/// (field 22, counted from the pid; the command, field 2, may hold spaces
/// and parentheses), unless the process is a zombie.
fn start_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    // Field 3, the state: `Z` for a zombie.
    if fields.next()? == "Z" {
        return None;
    }
    // Fields 4 to 21, then 22.
    fields.nth(18)?.parse().ok()
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
        if old.host == self.host {
            if let Some(holder) = self.judge_here(old) {
                return holder;
            }
        }
        if old.heartbeat_at < now_us() - duration_us(EXECUTOR_TTL) {
            Holder::Stale
        } else {
            Holder::Live
        }
    }

    /// A holder on this host, judged by its process where procfs tells it
    /// apart; `None` leaves it to the heartbeat.
    fn judge_here(&self, old: &ExecutorRow) -> Option<Holder> {
        let (Some(holder), Some(me)) = (Process::in_token(&old.token), &self.process) else {
            // A holder of a release whose token names no process, or no
            // procfs here: a pid that is gone is dead.
            let gone = old.pid != self.pid && pid_alive(old.pid) == Some(false);
            return gone.then_some(Holder::DeadHere);
        };
        if holder.boot != me.boot {
            // The host restarted since: every process of that boot is gone.
            return Some(Holder::DeadHere);
        }
        if old.pid == self.pid && holder == *me {
            // This very process (another runtime of it).
            return None;
        }
        if Process::of(&old.pid.to_string()).as_ref() != Some(&holder) {
            // Gone, or the pid names a later process.
            return Some(Holder::DeadHere);
        }
        let silent = old.heartbeat_at < now_us() - duration_us(ALIVE_SILENCE_LIMIT);
        (!silent).then_some(Holder::Live)
    }
}

async fn register(keiro: &Keiro) -> Result<Registration> {
    let store = &keiro.inner.store;
    // Before taking anything over: a process whose clock is off would take
    // leases that are not lapsed.
    keiro
        .check_clock_at_start(&keiro.inner.requested_id)
        .await?;
    let process = Process::of("self");
    let uuid = uuid::Uuid::new_v4();
    let me = Me {
        token: match &process {
            Some(p) => format!("{uuid}@{}@{}", p.boot, p.start_ticks),
            None => uuid.to_string(),
        },
        host: host_name(),
        pid: i64::from(std::process::id()),
        process,
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

/// Whether process `pid` of this host is there (stopped counts, a zombie
/// does not); `None` without procfs, where it cannot be told.
fn pid_alive(pid: i64) -> Option<bool> {
    if !std::path::Path::new("/proc/self").exists() {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    Some(stat.as_deref().and_then(start_ticks).is_some())
}

#[cfg(test)]
mod tests {
    use super::{slot_id, start_ticks};

    #[test]
    fn the_first_slot_is_the_base_and_later_ones_are_numbered() {
        assert_eq!(slot_id("h/app", 1), "h/app");
        assert_eq!(slot_id("h/app", 2), "h/app#2");
        assert_eq!(slot_id("h/app", 64), "h/app#64");
    }

    /// Field 22 of a `/proc/PID/stat` line, whose command may hold spaces
    /// and parentheses; none for a zombie.
    #[test]
    fn a_stat_line_gives_its_start_ticks() {
        let fields_after = |state: &str| {
            let mut line = format!("4242 (my (odd) app) {state}");
            for n in 4..=21 {
                line.push_str(&format!(" {n}"));
            }
            line + " 987654 22 23"
        };
        assert_eq!(start_ticks(&fields_after("S")), Some(987654));
        assert_eq!(start_ticks(&fields_after("T")), Some(987654));
        assert_eq!(start_ticks(&fields_after("Z")), None);
        assert_eq!(start_ticks("4242 (cut"), None);
    }

    #[cfg(target_os = "linux")]
    mod on_linux {
        use super::super::{
            duration_us, now_us, ExecutorRow, Holder, Me, Process, ALIVE_SILENCE_LIMIT,
        };

        const SECOND: i64 = 1_000_000;

        /// This test's process, and a registration of another process of
        /// its host judging holders.
        fn this_process() -> (i64, Process) {
            let pid = i64::from(std::process::id());
            (pid, Process::of("self").expect("procfs reads this process"))
        }

        fn me() -> Me {
            let (pid, process) = this_process();
            Me {
                token: "new".into(),
                host: "h".into(),
                pid: pid + 1,
                process: Some(process),
            }
        }

        /// A holder on host `h`: process `pid` whose token names `process`,
        /// last heard of `silent_s` seconds ago.
        fn holder(pid: i64, process: Option<&Process>, silent_s: i64) -> ExecutorRow {
            ExecutorRow {
                id: "h/app".into(),
                token: match process {
                    Some(p) => format!("old@{}@{}", p.boot, p.start_ticks),
                    None => "old".into(),
                },
                host: "h".into(),
                pid,
                heartbeat_at: now_us() - silent_s * SECOND,
            }
        }

        /// A holder on this host whose process is still there (this test's,
        /// as a frozen or stopped one would be) keeps its identity past the
        /// heartbeat TTL: its runs may hold live leases, which a taker would
        /// claim as its own and run beside it. Only a silence far past any
        /// lease frees it.
        #[test]
        fn a_silent_holder_whose_process_is_there_keeps_its_identity() {
            let (pid, process) = this_process();
            assert_eq!(me().judge(&holder(pid, Some(&process), 12)), Holder::Live);
            assert_eq!(me().judge(&holder(pid, Some(&process), 600)), Holder::Live);
            let hour = duration_us(ALIVE_SILENCE_LIMIT) / SECOND;
            let past = holder(pid, Some(&process), hour + 60);
            assert_eq!(me().judge(&past), Holder::Stale);
            // Another host's: the heartbeat decides.
            let mut elsewhere = holder(pid, Some(&process), 12);
            elsewhere.host = "other".into();
            assert_eq!(me().judge(&elsewhere), Holder::Stale);
        }

        /// A holder whose pid now names another process (a restarted
        /// container's pids start over), whose host restarted, or whose pid
        /// is gone, is dead: its identity is taken at once, whatever its
        /// heartbeat says.
        #[test]
        fn a_holder_whose_process_is_gone_is_dead() {
            let (pid, process) = this_process();
            let earlier = Process {
                start_ticks: process.start_ticks.saturating_sub(1),
                ..process.clone()
            };
            assert_eq!(
                me().judge(&holder(pid, Some(&earlier), 0)),
                Holder::DeadHere
            );
            let other_boot = Process {
                boot: "another-boot".into(),
                ..process.clone()
            };
            assert_eq!(
                me().judge(&holder(pid, Some(&other_boot), 0)),
                Holder::DeadHere
            );
            // Beyond `pid_max`: no such process.
            let gone = 1 << 23;
            assert_eq!(
                me().judge(&holder(gone, Some(&process), 0)),
                Holder::DeadHere
            );
            assert_eq!(me().judge(&holder(gone, None, 0)), Holder::DeadHere);
        }

        /// A holder whose token names no process (an earlier release's) is
        /// judged as before: dead when its pid is gone, else by its
        /// heartbeat; so is another runtime of this very process.
        #[test]
        fn a_holder_naming_no_process_is_judged_by_its_heartbeat() {
            let (pid, process) = this_process();
            assert_eq!(me().judge(&holder(pid, None, 12)), Holder::Stale);
            assert_eq!(me().judge(&holder(pid, None, 1)), Holder::Live);
            let mut this_very = me();
            this_very.pid = pid;
            assert_eq!(
                this_very.judge(&holder(pid, Some(&process), 12)),
                Holder::Stale
            );
        }
    }
}
