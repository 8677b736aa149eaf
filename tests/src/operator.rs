//! What the operator tests (the `keiro` command, the admin API) share:
//! per-test switches a workflow consults, and setting an instance aside as
//! a replay that met other code would.

use std::collections::HashSet;
use std::sync::Mutex;

use keiro::Keiro;

/// Test keys that are switched on, for a workflow to behave differently
/// while its key is on (crash after a step, say). A `static` of this type
/// serves every test of a binary, each under its own key.
#[derive(Debug)]
pub struct Switches(Mutex<Option<HashSet<String>>>);

impl Switches {
    /// No key switched on.
    pub const fn new() -> Switches {
        Switches(Mutex::new(None))
    }

    /// Switches `key` on or off.
    pub fn set(&self, key: &str, on: bool) {
        let mut keys = self.0.lock().unwrap();
        let keys = keys.get_or_insert_with(HashSet::new);
        if on {
            keys.insert(key.to_owned());
        } else {
            keys.remove(key);
        }
    }

    /// Whether `key` is switched on.
    pub fn is_on(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|keys| keys.contains(key))
    }
}

impl Default for Switches {
    fn default() -> Switches {
        Switches::new()
    }
}

/// The diagnostic [`set_aside`] records.
pub const SET_ASIDE_ERROR: &str = "journal has step `a`, code calls step `b`";

/// Marks instance `id` set aside for non-determinism (status
/// `nondeterministic`, [`SET_ASIDE_ERROR`] as its error), as a replay that
/// met other code would.
pub async fn set_aside(keiro: &Keiro, id: &str) {
    let view = keiro.store();
    if let Some(pool) = view.sqlite_pool() {
        sqlx::query(
            "UPDATE keiro_workflows SET status = 'nondeterministic', error = ?1 WHERE id = ?2",
        )
        .bind(SET_ASIDE_ERROR)
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    } else {
        sqlx::query(
            "UPDATE keiro.workflows SET status = 'nondeterministic', error = $1 WHERE id = $2",
        )
        .bind(SET_ASIDE_ERROR)
        .bind(id)
        .execute(view.postgres_pool().expect("a SQLite or PostgreSQL store"))
        .await
        .unwrap();
    }
}
