//! A plain text table: columns as wide as their widest cell, two spaces apart, numbers aligned
//! to the right. Drawn by hand: a table crate would be a dependency for twenty lines.

use std::fmt;

/// A table with a header row.
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Column {
    title: &'static str,
    right: bool,
}

impl Table {
    /// A table whose columns are `titles`; a title ending in `>` (left out when drawn) is
    /// aligned right, for numbers.
    pub fn new(titles: &[&'static str]) -> Table {
        Table {
            columns: titles
                .iter()
                .map(|title| match title.strip_suffix('>') {
                    Some(title) => Column { title, right: true },
                    None => Column {
                        title,
                        right: false,
                    },
                })
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row, one cell per column.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "one cell per column");
        self.rows.push(cells);
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, column)| {
                self.rows
                    .iter()
                    .map(|row| width(&row[i]))
                    .chain([width(column.title)])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let titles: Vec<&str> = self.columns.iter().map(|c| c.title).collect();
        for row in std::iter::once(titles).chain(
            self.rows
                .iter()
                .map(|row| row.iter().map(String::as_str).collect()),
        ) {
            let mut line = String::new();
            for (i, (cell, column)) in row.iter().zip(&self.columns).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(cell));
                if column.right {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// The width of a cell on a terminal, in characters (labels may hold any text).
fn width(cell: &str) -> usize {
    cell.chars().count()
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_line_up() {
        let mut table = Table::new(&["KEY", "FENCE>", "HOLDER"]);
        table.row(vec!["acct:42".into(), "7".into(), "billing::submit".into()]);
        table.row(vec!["é".into(), "1234".into(), String::new()]);
        assert_eq!(
            table.to_string(),
            "KEY      FENCE  HOLDER\n\
             acct:42      7  billing::submit\n\
             é         1234\n"
        );
    }
}
