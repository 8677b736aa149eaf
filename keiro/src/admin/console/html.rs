//! Writing HTML safely: every stored value goes through [`escape`], and
//! every page through [`page`], which gives it the shared head, navigation
//! and read-only banner.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by entities, so it is
/// text wherever it lands: in an element, or in a quoted attribute.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one component of a URL (path segment or query value):
/// everything but unreserved characters percent-encoded.
pub(crate) fn url_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The instance list's path under `base`: `/` at the root, else `base`
/// itself (a router nested at `/keiro` answers `/keiro`, not `/keiro/`).
pub(crate) fn home(base: &str) -> String {
    if base.is_empty() {
        "/".to_owned()
    } else {
        base.to_owned()
    }
}

/// Which page of the console a page is, for the navigation's highlight.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    /// The instance list and instance pages.
    Instances,
    /// The timers page.
    Timers,
}

/// What every page shares: where the console is mounted and whether it may
/// change anything.
pub(crate) struct Frame<'a> {
    /// The path the router is mounted under (`""` at the root, `/keiro`
    /// when nested there), so links work under any mount point.
    pub(crate) base: &'a str,
    /// Whether a token is configured (operations allowed).
    pub(crate) writable: bool,
    /// The store's backend, shown in the header.
    pub(crate) backend: &'a str,
}

/// A whole page: `title` (escaped here) and `body` (already HTML).
pub(crate) fn page(frame: &Frame<'_>, section: Section, title: &str, body: &str) -> String {
    let base = escape(frame.base);
    let current = |s: Section| {
        if s == section {
            " class=\"current\""
        } else {
            ""
        }
    };
    let banner = if frame.writable {
        "<div id=\"token-bar\"><label>Admin token \
         <input id=\"token\" type=\"password\" autocomplete=\"off\" \
         placeholder=\"needed for operations\"></label></div>"
            .to_owned()
    } else {
        "<div id=\"read-only\" class=\"banner\">Read-only: no admin token is configured \
         (set KEIRO_ADMIN_TOKEN, or <code>Admin::token</code>), so operations are disabled.</div>"
            .to_owned()
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · keiro</title>\
         <link rel=\"stylesheet\" href=\"{base}/assets/console.css\">\
         <script src=\"{base}/assets/console.js\" defer></script></head>\
         <body data-base=\"{base}\" data-writable=\"{writable}\">\
         <header><a class=\"brand\" href=\"{home}\">keiro</a>\
         <nav><a href=\"{home}\"{instances}>Instances</a>\
         <a href=\"{base}/timers\"{timers}>Timers</a></nav>\
         <span class=\"backend\">{backend}</span>\
         <label class=\"live\"><input id=\"live\" type=\"checkbox\" checked> live</label></header>\
         {banner}<main><h1>{title}</h1>{body}</main>\
         <div id=\"op-result\" role=\"status\"></div></body></html>\n",
        title = escape(title),
        home = escape(&home(frame.base)),
        writable = frame.writable,
        instances = current(Section::Instances),
        timers = current(Section::Timers),
        backend = escape(frame.backend),
    )
}

/// `value` as compact JSON text, cut at `max` characters with `…`.
pub(crate) fn json_preview(value: &serde_json::Value, max: usize) -> String {
    cut(&value.to_string(), max)
}

/// `text` cut at `max` characters with `…`.
pub(crate) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// A JSON value as escaped, pretty-printed text in a `<pre>`, behind a
/// one-line preview when it is long.
pub(crate) fn json_block(value: &serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let preview = json_preview(value, 80);
    if pretty.len() <= 80 && !pretty.contains('\n') {
        format!("<code class=\"value\">{}</code>", escape(&pretty))
    } else {
        format!(
            "<details class=\"value\"><summary><code>{}</code></summary><pre>{}</pre></details>",
            escape(&preview),
            escape(&pretty)
        )
    }
}

/// `at` as an RFC 3339 UTC time with milliseconds, in a `<time>` element
/// whose text is the short form and whose title is the exact one.
pub(crate) fn time(at: SystemTime) -> String {
    let exact = crate::admin::json::rfc3339(at);
    format!(
        "<time datetime=\"{exact}\" title=\"{exact}\">{}</time>",
        exact.get(..19).unwrap_or(&exact).replace('T', " ")
    )
}

/// A duration the way people read one: `850 µs`, `12.4 ms`, `3.2 s`, `4 min 5 s`.
pub(crate) fn duration(d: Duration) -> String {
    let micros = d.as_micros();
    if micros < 1_000 {
        format!("{micros} µs")
    } else if micros < 1_000_000 {
        format!("{:.1} ms", micros as f64 / 1_000.0)
    } else if micros < 60_000_000 {
        format!("{:.1} s", micros as f64 / 1_000_000.0)
    } else {
        let secs = d.as_secs();
        if secs < 3_600 {
            format!("{} min {} s", secs / 60, secs % 60)
        } else {
            format!("{} h {} min", secs / 3_600, (secs % 3_600) / 60)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        let hostile = r#""><img src=x onerror=alert(1)><script>alert('x')</script>&"#;
        let escaped = escape(hostile);
        for raw in ['<', '>', '"', '\''] {
            assert!(!escaped.contains(raw), "{raw} survived in {escaped}");
        }
        assert_eq!(
            escape("a<b>&'\""),
            "a&lt;b&gt;&amp;&#39;&quot;",
            "each special character has its entity"
        );
    }

    #[test]
    fn url_component_encodes_everything_but_unreserved() {
        assert_eq!(
            url_component("order 42/x?y=&z"),
            "order%2042%2Fx%3Fy%3D%26z"
        );
        assert_eq!(url_component("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(url_component("é"), "%C3%A9");
    }

    #[test]
    fn long_json_previews_are_cut() {
        let value = serde_json::json!({"text": "x".repeat(200)});
        let preview = json_preview(&value, 20);
        assert_eq!(preview.chars().count(), 21);
        assert!(preview.ends_with('…'));
        assert_eq!(json_preview(&serde_json::json!(1), 20), "1");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(duration(Duration::from_micros(12_400)), "12.4 ms");
        assert_eq!(duration(Duration::from_millis(3_200)), "3.2 s");
        assert_eq!(duration(Duration::from_secs(245)), "4 min 5 s");
        assert_eq!(duration(Duration::from_secs(7_500)), "2 h 5 min");
    }
}
