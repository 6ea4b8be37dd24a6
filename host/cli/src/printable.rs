//! Text from plugins and pods shown on a terminal. A plugin chooses its log lines, error
//! messages and change descriptions; printed raw, an escape sequence in them could
//! rewrite the screen or a carriage return could forge a line of our own output. Every
//! control character (tabs aside) is shown as an escape instead.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with control characters escaped (`\u{1b}`, `\r`, `\n`), tabs kept.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => out.push('\t'),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("plain\ttext"), "plain\ttext");
        assert_eq!(
            printable("\u{1b}[2J\u{1b}[Hgone"),
            "\\u{1b}[2J\\u{1b}[Hgone"
        );
        assert_eq!(printable("ok\r\noutcome  ok"), "ok\\r\\noutcome  ok");
        assert_eq!(printable("bell\u{7}"), "bell\\u{7}");
    }
}
