//! Aligned tables that fit a terminal line: columns sized to their widest
//! cell, the widest shrunk first until the row fits, cut cells ending in `…`.

/// The widest line the command prints.
pub(crate) const WIDTH: usize = 100;

/// Spaces between two columns.
const GAP: usize = 2;

/// How narrow the last column gets before any other column gives way.
const LAST_KEPT: usize = 20;

/// A table of text cells under a header row.
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column headers.
    pub(crate) fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as headers; control characters become spaces).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells.iter().map(|c| one_line(c)).collect());
    }

    /// The table, every line at most [`WIDTH`] characters, each ending in `\n`.
    pub(crate) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        // The last column (free text: an error, a value) gives way first,
        // down to `LAST_KEPT`; then the widest column, so ids stay whole
        // as long as possible. Never below a header or 4 characters (then
        // the line may stay too wide, which only very many columns need).
        let floor: Vec<usize> = self
            .headers
            .iter()
            .map(|h| h.chars().count().max(4))
            .collect();
        let gaps = GAP * widths.len().saturating_sub(1);
        let over = |widths: &[usize]| (widths.iter().sum::<usize>() + gaps).saturating_sub(WIDTH);
        if let Some(last) = widths.len().checked_sub(1) {
            let keep = widths[last].min(LAST_KEPT).max(floor[last]);
            // A last column narrower than its floor (a header under 4
            // characters) has nothing to give.
            widths[last] -= over(&widths).min(widths[last].saturating_sub(keep));
        }
        while over(&widths) > 0 {
            let Some(widest) = (0..widths.len())
                .filter(|&i| widths[i] > floor[i])
                .max_by_key(|&i| (widths[i], i))
            else {
                break;
            };
            widths[widest] -= 1;
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                let cell = fit(cell, *width);
                if i + 1 == row.len() {
                    line.push_str(&cell);
                } else {
                    let pad = width - cell.chars().count() + GAP;
                    line.push_str(&cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

impl Table {
    /// One page of a listing: the table (or `none` when it has no rows),
    /// then, when another page follows, how to ask for it.
    pub(crate) fn page(&self, none: &str, next_cursor: Option<&str>) -> String {
        let mut text = if self.rows.is_empty() {
            format!("{none}\n")
        } else {
            self.render()
        };
        if let Some(cursor) = next_cursor {
            text.push_str(&format!("more: add --cursor {cursor}\n"));
        }
        text
    }
}

/// `text` cut to `width` characters, ending in `…` when cut.
pub(crate) fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `text` on one line: newlines, tabs and other control characters become
/// spaces, so a multi-line error keeps the table aligned.
pub(crate) fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A label-and-value block (`show`'s summary), each line cut to [`WIDTH`].
pub(crate) fn fields(pairs: &[(&str, String)]) -> String {
    let label = pairs
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (name, value) in pairs {
        let line = format!("{name:<label$}  {}", one_line(value));
        out.push_str(fit(&line, WIDTH).trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_within_the_width() {
        let mut table = Table::new(&["ID", "STATUS", "DETAIL"]);
        table.row(vec!["a".into(), "failed".into(), "x".repeat(300)]);
        table.row(vec!["order-42".into(), "ok".into(), "line\nbreak".into()]);
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        for line in &lines {
            assert!(line.chars().count() <= WIDTH, "{line}");
        }
        assert!(lines[0].starts_with("ID        STATUS  DETAIL"), "{text}");
        assert!(lines[1].ends_with('…'), "{text}");
        assert_eq!(lines[1].chars().count(), WIDTH);
        assert!(lines[2].ends_with("line break"), "{text}");
    }

    #[test]
    fn the_last_column_gives_way_first_then_the_widest() {
        let mut table = Table::new(&["ID", "NAME", "DETAIL"]);
        table.row(vec!["i".repeat(60), "n".repeat(10), "d".repeat(60)]);
        let text = table.render();
        let line = text.lines().nth(1).unwrap();
        assert_eq!(line.chars().count(), WIDTH);
        // The id fits whole beside a shortened detail.
        assert!(line.starts_with(&format!("{}  {}  ", "i".repeat(60), "n".repeat(10))));
        assert!(line.ends_with('…'), "{line}");

        let mut table = Table::new(&["ID", "NAME", "DETAIL"]);
        table.row(vec!["i".repeat(80), "n".repeat(10), "d".repeat(60)]);
        let text = table.render();
        let line = text.lines().nth(1).unwrap();
        assert_eq!(line.chars().count(), WIDTH);
        // Past that, the widest (the id) gives way; the name stays whole
        // and the detail keeps its share.
        assert!(line.contains(&format!("  {}  ", "n".repeat(10))), "{line}");
        assert!(
            line.ends_with(&format!("{}…", "d".repeat(LAST_KEPT - 1))),
            "{line}"
        );
        assert_eq!(line.matches('…').count(), 2, "{line}");
    }

    #[test]
    fn fit_cuts_with_an_ellipsis() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
    }
}
