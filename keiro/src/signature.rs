//! A workflow's signature: its argument and return types, recorded with each
//! instance so that a worker whose workflow of the same name has other types
//! (another binary's, or one whose types changed) leaves the instance alone
//! instead of failing to decode it.
//!
//! It is built from [`std::any::type_name`] with every module path stripped
//! (`core::result::Result<app::Receipt, app::ShopError>` becomes
//! `Result<Receipt,ShopError>`): moving a type to another module or naming it
//! through an alias strands no instance, while two different workflows
//! sharing a name almost always differ. Changing a workflow's argument or
//! return types changes it too: instances started before such a deploy wait
//! for a binary with the old types, reported on every pass, instead of
//! crash-looping to `Failed`.

/// The signature of a workflow taking the argument tuple `A` and returning `R`:
/// `(Order,u32)->Result<Receipt,ShopError>`.
pub fn of<A: ?Sized, R: ?Sized>() -> String {
    format!(
        "{}->{}",
        strip_paths(std::any::type_name::<A>()),
        strip_paths(std::any::type_name::<R>())
    )
}

/// `type_name` output without module paths and without the space after
/// commas: `(alloc::string::String, u32)` becomes `(String,u32)`.
fn strip_paths(type_name: &str) -> String {
    let mut out = String::with_capacity(type_name.len());
    let mut segment = String::new();
    let mut chars = type_name.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            segment.push(c);
        } else if c == ':' && chars.peek() == Some(&':') {
            // The segment was a module (or type) path prefix: drop it.
            chars.next();
            segment.clear();
        } else {
            out.push_str(&segment);
            segment.clear();
            if !(c == ' ' && out.ends_with(',')) {
                out.push(c);
            }
        }
    }
    out.push_str(&segment);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    mod app {
        pub(crate) struct Receipt;
        pub(crate) struct ShopError;
        pub(crate) mod moved {
            pub(crate) struct Receipt;
        }
    }

    #[test]
    fn module_paths_and_spaces_are_stripped() {
        assert_eq!(
            strip_paths("core::result::Result<app::Receipt, app::ShopError>"),
            "Result<Receipt,ShopError>"
        );
        assert_eq!(strip_paths("(alloc::string::String,)"), "(String,)");
        assert_eq!(strip_paths("[u8; 4]"), "[u8; 4]");
        assert_eq!(strip_paths("&'static str"), "&'static str");
    }

    #[test]
    fn the_signature_names_arguments_and_return_type() {
        assert_eq!(
            of::<(String, u32), Result<app::Receipt, app::ShopError>>(),
            "(String,u32)->Result<Receipt,ShopError>"
        );
        assert_eq!(of::<(), ()>(), "()->()");
    }

    #[test]
    fn moving_a_type_or_aliasing_it_keeps_the_signature() {
        type Alias = app::Receipt;
        assert_eq!(
            of::<(app::Receipt,), ()>(),
            of::<(app::moved::Receipt,), ()>()
        );
        assert_eq!(of::<(Alias,), ()>(), of::<(app::Receipt,), ()>());
        assert_ne!(of::<(u32,), ()>(), of::<(String,), ()>());
    }
}
