//! Tables that fit the terminal: columns as wide as their widest cell, and when the whole is
//! wider than the terminal, the flexible columns (free text: a message preview, a directory)
//! shrink and their cells end with `…`. Output that is not a terminal keeps every cell whole,
//! for scripts.

use std::io::IsTerminal;

/// Narrowest a flexible column shrinks to.
const MIN_FLEXIBLE_WIDTH: usize = 8;

/// The terminal's width when standard output is one (`COLUMNS` first, as shells export it).
pub fn terminal_width() -> Option<usize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|columns| columns.trim().parse().ok())
        .or_else(|| crate::agent::terminal::size(1).map(|(_, cols)| usize::from(cols)))
        .filter(|width| *width > 0)
}

/// Lays out `rows` (the first is the header) as lines; `flexible` columns shrink to fit `width`.
/// Every cell must already have its controls made visible.
pub fn render(rows: &[Vec<String>], flexible: &[usize], width: Option<usize>) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|row| row.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    if let Some(width) = width {
        let total = |widths: &[usize]| widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        // Shrink the widest flexible column, one character at a time, until it fits or none can.
        while total(&widths) > width {
            let Some(&widest) =
                flexible.iter().filter(|&&c| c < columns && widths[c] > MIN_FLEXIBLE_WIDTH).max_by_key(|&&c| widths[c])
            else {
                break;
            };
            widths[widest] -= 1;
        }
    }
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    let shown = truncate(cell, widths[c]);
                    if c + 1 == row.len() { shown } else { format!("{shown:<width$}", width = widths[c]) }
                })
                .collect();
            cells.join("  ").trim_end().to_string()
        })
        .collect()
}

/// `text` cut to `width` characters, its end replaced by `…` when cut.
pub fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<Vec<String>> {
        vec![
            vec!["TYPE".into(), "CURRENT".into(), "DIR".into()],
            vec!["claude".into(), "a very long message preview that goes on".into(), "/home/user/project".into()],
        ]
    }

    #[test]
    fn a_table_wider_than_the_terminal_shrinks_its_free_text_columns_with_an_ellipsis() {
        let lines = render(&table(), &[1, 2], Some(40));
        assert!(lines.iter().all(|line| line.chars().count() <= 40), "{lines:#?}");
        assert!(lines[1].contains('…'), "{lines:#?}");
        assert!(lines[1].starts_with("claude  "), "fixed columns stay whole: {lines:#?}");
    }

    #[test]
    fn without_a_terminal_every_cell_stays_whole() {
        let lines = render(&table(), &[1, 2], None);
        assert!(
            lines[1].contains("a very long message preview that goes on") && lines[1].ends_with("/home/user/project")
        );
    }
}
