//! Cron schedules: the `schedules` table every worker of a database reads
//! (migration 0017). A row is a schedule's definition (cron expression, time
//! zone, workflow and, for a dynamic schedule, the call's arguments), whether
//! it is paused, and the latest tick a worker created an instance for.

use crate::rows::{FromRow, StoreRow};
use crate::sql::Dialect;
use crate::{Result, Store};

/// The columns of a [`ScheduleRow`].
const COLUMNS: &str = "name, cron, timezone, workflow, input, paused, last_tick, updated_at";

/// One stored schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRow {
    /// The schedule's name: the workflow's for a `#[workflow(cron = "..")]`
    /// schedule, the one given for a dynamic one.
    pub name: String,
    /// The cron expression (seconds field first).
    pub cron: String,
    /// The IANA time zone the expression is read in (`UTC`, `Europe/Berlin`).
    pub timezone: String,
    /// The workflow each tick starts.
    pub workflow: String,
    /// A dynamic schedule's encoded call arguments; `None` for a
    /// `#[workflow(cron = "..")]` schedule, whose argument is the tick time.
    pub input: Option<String>,
    /// Whether ticks are paused.
    pub paused: bool,
    /// The latest tick an instance was created for, or passed over (a
    /// tick that fell while paused, or before the definition changed), in
    /// µs since the Unix epoch.
    pub last_tick: Option<i64>,
    /// When the row was last written (defined, redefined, paused or
    /// resumed), µs since the Unix epoch by the writer's clock.
    pub updated_at: i64,
}

impl FromRow for ScheduleRow {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let name = row.text(|| "a schedule".into(), "name")?;
        let what = || format!("schedule `{name}`");
        Ok(ScheduleRow {
            cron: row.text(what, "cron")?,
            timezone: row.text(what, "timezone")?,
            workflow: row.text(what, "workflow")?,
            input: row.maybe_text(what, "input")?,
            paused: row.int(what, "paused")? != 0,
            last_tick: row.maybe_int(what, "last_tick")?,
            updated_at: row.int(what, "updated_at")?,
            name,
        })
    }
}

/// The statements of the schedule operations.
#[derive(Debug)]
pub(crate) struct ScheduleStatements {
    /// Writes a `#[workflow(cron)]` schedule `$1` (cron `$2`, zone `$3`,
    /// workflow `$4`, now `$5`), updating the definition of an existing one
    /// unless it is dynamic; keeps `paused`, and `last_tick` unless the cron
    /// or zone changes: then it moves forward to `$6` (see
    /// [`ScheduleDef::latest_tick`]; not at all when negative).
    upsert_static: String,
    /// Writes `#[workflow(cron)]` schedule `$1` (as `upsert_static`) unless
    /// a schedule of that name exists.
    insert_static: String,
    /// Writes dynamic schedule `$1` (cron `$2`, zone `$3`, workflow `$4`,
    /// input `$5`, now `$6`), replacing the definition of an existing
    /// dynamic one (keeping `paused`, and `last_tick` as `upsert_static`
    /// does with `$7`), never a `#[workflow(cron)]` one.
    upsert_dynamic: String,
    /// Every schedule, by name.
    list: String,
    /// Schedule `$1`.
    get: String,
    /// Sets `paused` of `$1` to `$2` at `$3`.
    set_paused: String,
    /// Resumes `$1` at `$3`, moving its `last_tick` forward to `$2` (never
    /// back; not at all when `$2` is negative).
    unpause: String,
    /// Deletes schedule `$1`.
    delete: String,
    /// Deletes schedule `$1` if it is a `#[workflow(cron)]` one.
    delete_static: String,
    /// Moves `last_tick` of `$1` forward to `$2` (never back).
    record_tick: String,
}

impl ScheduleStatements {
    pub(crate) fn new(d: &Dialect) -> ScheduleStatements {
        let t = format!("{}schedules", d.tables);
        ScheduleStatements {
            upsert_static: format!(
                "INSERT INTO {t} (name, cron, timezone, workflow, input, paused, created_at, \
                 updated_at) VALUES ($1, $2, $3, $4, NULL, 0, $5, $5) \
                 ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, \
                 timezone = excluded.timezone, workflow = excluded.workflow, \
                 updated_at = excluded.updated_at, last_tick = {redefined} \
                 WHERE {t}.input IS NULL AND ({t}.cron <> excluded.cron \
                 OR {t}.timezone <> excluded.timezone OR {t}.workflow <> excluded.workflow)",
                redefined = redefined(&t, 6),
            ),
            insert_static: format!(
                "INSERT INTO {t} (name, cron, timezone, workflow, input, paused, created_at, \
                 updated_at) VALUES ($1, $2, $3, $4, NULL, 0, $5, $5) \
                 ON CONFLICT (name) DO NOTHING"
            ),
            upsert_dynamic: format!(
                "INSERT INTO {t} (name, cron, timezone, workflow, input, paused, created_at, \
                 updated_at) VALUES ($1, $2, $3, $4, $5, 0, $6, $6) \
                 ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, \
                 timezone = excluded.timezone, workflow = excluded.workflow, \
                 input = excluded.input, updated_at = excluded.updated_at, \
                 last_tick = {redefined} \
                 WHERE {t}.input IS NOT NULL",
                redefined = redefined(&t, 7),
            ),
            list: format!("SELECT {COLUMNS} FROM {t} ORDER BY name"),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE name = $1"),
            set_paused: format!("UPDATE {t} SET paused = $2, updated_at = $3 WHERE name = $1"),
            unpause: format!(
                "UPDATE {t} SET paused = 0, updated_at = $3, last_tick = CASE \
                     WHEN $2 >= 0 AND (last_tick IS NULL OR last_tick < $2) THEN $2 \
                     ELSE last_tick END \
                 WHERE name = $1"
            ),
            delete: format!("DELETE FROM {t} WHERE name = $1"),
            delete_static: format!("DELETE FROM {t} WHERE name = $1 AND input IS NULL"),
            record_tick: format!(
                "UPDATE {t} SET last_tick = $2 \
                 WHERE name = $1 AND (last_tick IS NULL OR last_tick < $2)"
            ),
        }
    }
}

/// The `last_tick` an upsert into `t` leaves: moved forward to parameter
/// `$n` (never back; not at all when negative) when the cron expression or
/// the time zone changes, else kept.
fn redefined(t: &str, n: usize) -> String {
    format!(
        "CASE WHEN ({t}.cron <> excluded.cron OR {t}.timezone <> excluded.timezone) \
             AND ${n} >= 0 AND ({t}.last_tick IS NULL OR {t}.last_tick < ${n}) \
         THEN ${n} ELSE {t}.last_tick END"
    )
}

/// A new or changed schedule definition.
#[derive(Debug, Clone, Copy)]
pub struct ScheduleDef<'a> {
    /// The schedule's name.
    pub name: &'a str,
    /// The cron expression (seconds field first).
    pub cron: &'a str,
    /// The IANA time zone.
    pub timezone: &'a str,
    /// The workflow each tick starts.
    pub workflow: &'a str,
    /// The call's encoded arguments (a dynamic schedule), or `None` (a
    /// `#[workflow(cron = "..")]` one: the tick time is the argument).
    pub input: Option<&'a str>,
    /// The definition's latest tick at or before now (µs since the Unix
    /// epoch), if any: when the write changes an existing schedule's cron
    /// expression or time zone, it becomes the schedule's last tick (never
    /// moving it back), so a worker starting later does not run a tick that
    /// fell before the definition existed as a missed one.
    pub latest_tick: Option<i64>,
}

impl Store {
    /// Writes a schedule's definition, keeping its paused state and last
    /// tick. Returns whether a row was written: for a `#[workflow(cron)]`
    /// definition (`input: None`), a new schedule or a changed definition
    /// (it never replaces a dynamic schedule of the same name); for a
    /// dynamic one, `false` means the name is held by a `#[workflow(cron)]`
    /// schedule and nothing was written.
    pub async fn put_schedule(&self, def: &ScheduleDef<'_>) -> Result<bool> {
        self.put_schedule_at(def, self.now_us()).await
    }

    /// [`Store::put_schedule`], the write stamped at `now` (µs since the
    /// Unix epoch) rather than by this store's clock: a management call
    /// passes the database server's time, since a new schedule's ticks
    /// after its making count as missed when no worker ran them.
    pub async fn put_schedule_at(&self, def: &ScheduleDef<'_>, now: i64) -> Result<bool> {
        let latest = def.latest_tick.unwrap_or(-1);
        let written = match def.input {
            None => {
                self.execute(
                    "put_schedule",
                    |s| &s.schedules.upsert_static,
                    &args![def.name, def.cron, def.timezone, def.workflow, now, latest],
                )
                .await?
            }
            Some(input) => {
                self.execute(
                    "put_schedule",
                    |s| &s.schedules.upsert_dynamic,
                    &args![
                        def.name,
                        def.cron,
                        def.timezone,
                        def.workflow,
                        input,
                        now,
                        latest
                    ],
                )
                .await?
            }
        };
        Ok(written > 0)
    }

    /// Writes `#[workflow(cron)]` schedule `def` (its `input` is ignored)
    /// unless a schedule of its name exists, whatever its definition.
    /// Returns whether it was written.
    pub async fn add_static_schedule(&self, def: &ScheduleDef<'_>) -> Result<bool> {
        self.add_static_schedule_at(def, self.now_us()).await
    }

    /// [`Store::add_static_schedule`], the write stamped at `now` (see
    /// [`Store::put_schedule_at`]).
    pub async fn add_static_schedule_at(&self, def: &ScheduleDef<'_>, now: i64) -> Result<bool> {
        let written = self
            .execute(
                "add_static_schedule",
                |s| &s.schedules.insert_static,
                &args![def.name, def.cron, def.timezone, def.workflow, now],
            )
            .await?;
        Ok(written > 0)
    }

    /// Every stored schedule, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        self.fetch_all("schedules", |s| &s.schedules.list, &[], None)
            .await
    }

    /// Every stored schedule, by name, each row read on its own: one that
    /// does not decode (a hand-edited column) is an `Err` naming it, and
    /// the others still read.
    pub async fn schedules_each(&self) -> Result<Vec<Result<ScheduleRow>>> {
        self.fetch_each("schedules", |s| &s.schedules.list, &[], None)
            .await
    }

    /// The stored schedule `name`, if any.
    pub async fn schedule_named(&self, name: &str) -> Result<Option<ScheduleRow>> {
        self.fetch_optional("schedule", |s| &s.schedules.get, &args![name])
            .await
    }

    /// Pauses or resumes schedule `name`; `false` when there is none.
    pub async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<bool> {
        self.set_schedule_paused_at(name, paused, self.now_us())
            .await
    }

    /// [`Store::set_schedule_paused`], the write stamped at `now` (see
    /// [`Store::put_schedule_at`]).
    pub async fn set_schedule_paused_at(&self, name: &str, paused: bool, now: i64) -> Result<bool> {
        let changed = self
            .execute(
                "set_schedule_paused",
                |s| &s.schedules.set_paused,
                &args![name, i64::from(paused), now],
            )
            .await?;
        Ok(changed > 0)
    }

    /// Resumes schedule `name`, recording `passed_over` (the latest tick
    /// that fell while it was paused, if any) as its last tick in the same
    /// statement, so no reader sees it resumed with that tick unrecorded;
    /// `false` when there is none.
    pub async fn unpause_schedule(&self, name: &str, passed_over: Option<i64>) -> Result<bool> {
        self.unpause_schedule_at(name, passed_over, self.now_us())
            .await
    }

    /// [`Store::unpause_schedule`], the write stamped at `now` (see
    /// [`Store::put_schedule_at`]).
    pub async fn unpause_schedule_at(
        &self,
        name: &str,
        passed_over: Option<i64>,
        now: i64,
    ) -> Result<bool> {
        let changed = self
            .execute(
                "unpause_schedule",
                |s| &s.schedules.unpause,
                &args![name, passed_over.unwrap_or(-1), now],
            )
            .await?;
        Ok(changed > 0)
    }

    /// Deletes schedule `name`; `false` when there was none.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let changed = self
            .execute("delete_schedule", |s| &s.schedules.delete, &args![name])
            .await?;
        Ok(changed > 0)
    }

    /// Deletes schedule `name` if it is a `#[workflow(cron)]` one (a
    /// dynamic schedule of that name stays); `false` when there was none.
    pub async fn delete_static_schedule(&self, name: &str) -> Result<bool> {
        let changed = self
            .execute(
                "delete_static_schedule",
                |s| &s.schedules.delete_static,
                &args![name],
            )
            .await?;
        Ok(changed > 0)
    }

    /// Records that an instance was created for the tick at `tick_us` of
    /// schedule `name` (the latest such tick is kept).
    pub async fn record_schedule_tick(&self, name: &str, tick_us: i64) -> Result<()> {
        self.execute(
            "record_schedule_tick",
            |s| &s.schedules.record_tick,
            &args![name, tick_us],
        )
        .await?;
        Ok(())
    }
}
