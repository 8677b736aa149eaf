//! Awakeable ids: `<workflow id>/<generation>/<step>/<secret>`.
//!
//! The first three parts locate the awakeable's creation step; the secret
//! (122 random bits, journaled with the creation step so a replay hands out
//! the same id) makes the id a capability: knowing a workflow id is not
//! enough to answer its awakeables. Awakeables created before secrets were
//! added keep the ids they were handed out with, `<workflow id>/<generation>/<step>`.

/// Characters in a secret: a v4 UUID as 32 lowercase hex digits.
const SECRET_LEN: usize = 32;

/// An awakeable id taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AwakeableId {
    /// The workflow instance that created it (may itself contain `/`).
    pub(crate) workflow: String,
    /// That instance's generation.
    pub(crate) generation: i64,
    /// The creation step's sequence number.
    pub(crate) seq: i64,
    /// The unguessable part; `None` in an id of the earlier form.
    pub(crate) secret: Option<String>,
}

impl AwakeableId {
    /// Takes `id` apart from the right, so workflow ids containing `/` parse.
    /// `None` when it has no such form.
    pub(crate) fn parse(id: &str) -> Option<AwakeableId> {
        let (rest, secret) = match id.rsplit_once('/') {
            // A step number never has 32 digits (an i64 has at most 19), so
            // a 32-hex-digit last part is a secret, never a step.
            Some((rest, last)) if is_secret(last) => (rest, Some(last.to_owned())),
            _ => (id, None),
        };
        let mut parts = rest.rsplitn(3, '/');
        let seq = parts.next()?.parse().ok()?;
        let generation = parts.next()?.parse().ok()?;
        let workflow = parts.next().filter(|w| !w.is_empty())?;
        Some(AwakeableId {
            workflow: workflow.to_owned(),
            generation,
            seq,
            secret,
        })
    }

    /// The id as handed out.
    pub(crate) fn format(
        workflow: &str,
        generation: i64,
        seq: i64,
        secret: Option<&str>,
    ) -> String {
        match secret {
            Some(secret) => format!("{workflow}/{generation}/{seq}/{secret}"),
            None => format!("{workflow}/{generation}/{seq}"),
        }
    }

    /// Whether this id carries exactly the secret `journaled` (`None`: an
    /// awakeable of the earlier form, whose ids carry none). Compared in
    /// constant time, so timing tells a guesser nothing about the secret.
    pub(crate) fn carries(&self, journaled: Option<&str>) -> bool {
        match (self.secret.as_deref(), journaled) {
            (None, None) => true,
            (Some(given), Some(journaled)) => {
                given.len() == journaled.len()
                    && given
                        .bytes()
                        .zip(journaled.bytes())
                        .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                        == 0
            }
            _ => false,
        }
    }
}

/// A fresh secret: 122 random bits of a v4 UUID, as 32 hex digits.
pub(crate) fn new_secret() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn is_secret(part: &str) -> bool {
    part.len() == SECRET_LEN && part.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::{new_secret, AwakeableId};

    fn id(workflow: &str, generation: i64, seq: i64, secret: Option<&str>) -> AwakeableId {
        AwakeableId {
            workflow: workflow.to_owned(),
            generation,
            seq,
            secret: secret.map(str::to_owned),
        }
    }

    #[test]
    fn ids_parse_from_the_right() {
        let secret = new_secret();
        let text = AwakeableId::format("order/1/0/7", 3, 9, Some(&secret));
        assert_eq!(
            AwakeableId::parse(&text),
            Some(id("order/1/0/7", 3, 9, Some(&secret)))
        );
        // The earlier form, without a secret.
        assert_eq!(
            AwakeableId::parse("order-1/3/0/7"),
            Some(id("order-1/3", 0, 7, None))
        );
        for bad in ["nonsense", "/0/1", "a/b/1", &format!("/0/1/{secret}")] {
            assert_eq!(AwakeableId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_journaled_secret_is_carried() {
        let secret = new_secret();
        assert_eq!(secret.len(), 32);
        assert_ne!(secret, new_secret());
        let with = id("w", 0, 0, Some(&secret));
        assert!(with.carries(Some(&secret)));
        assert!(!with.carries(Some(&new_secret())));
        assert!(!with.carries(None));
        let without = id("w", 0, 0, None);
        assert!(without.carries(None));
        assert!(!without.carries(Some(&secret)));
    }
}
