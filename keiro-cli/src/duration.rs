//! Durations as operators type them: `30s`, `15m`, `1h`, `30d`, `2w`.

use std::time::Duration;

/// The units [`parse`] takes, with their length in seconds.
const UNITS: [(&str, u64); 5] = [
    ("s", 1),
    ("m", 60),
    ("h", 3600),
    ("d", 86_400),
    ("w", 604_800),
];

/// Parses a whole number followed by one unit (`s`, `m`, `h`, `d`, `w`).
/// The error names the text and says what is expected; clap prints it as a
/// usage error.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!("`{text}` is not a duration: {why}; write a whole number and a unit: 30s, 15m, 1h, 30d, 2w")
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| bad("it has no unit"))?;
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(bad("it does not start with a number"));
    }
    let seconds = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, seconds)| *seconds)
        .ok_or_else(|| bad(&format!("`{unit}` is not a unit")))?;
    let number: u64 = number.parse().map_err(|_| bad("the number is too large"))?;
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| bad("it is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_text_is_named() {
        for bad in [
            "",
            "30",
            "h",
            "1.5h",
            "30x",
            "-1h",
            "1h30m",
            "99999999999999999999w",
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(&format!("`{bad}`")), "{error}");
            assert!(error.contains("30s, 15m, 1h, 30d, 2w"), "{error}");
        }
    }
}
