//! `weft COMMAND --help`: the part of the usage text about one command (its
//! usage lines, its paragraph under "Commands:" and its options section),
//! cut from the one text `weft --help` prints, so the two never disagree.

/// The commands: the admin ones, then those that run on their own.
pub const COMMANDS: [&str; 12] = [
    ADMIN[0], ADMIN[1], ADMIN[2], ADMIN[3], ADMIN[4], ADMIN[5], ADMIN[6], ADMIN[7], "serve",
    "cluster", "bench", "csi",
];

/// Commands that talk to a running node's API (`cli::parse` runs them; the
/// note on --api applies).
pub const ADMIN: [&str; 8] = [
    "pool",
    "volume",
    "snapshot",
    "host",
    "namespace",
    "node",
    "token",
    "top",
];

/// The help of `command` cut from `usage` (the text of `weft --help`).
pub fn for_command(usage: &str, command: &str) -> String {
    let sections = sections(usage);
    let mut help = String::from("Usage:\n");
    let mut admin_note = String::new();
    let usage_entries = entries(section(&sections, "Usage:"), |line| {
        line.starts_with("  weft ") || line.trim_start().starts_with("(admin commands")
    });
    for entry in usage_entries {
        if entry.trim_start().starts_with("(admin commands") {
            admin_note = entry;
        } else if entry.split_whitespace().nth(1) == Some(command) {
            help.push_str(&entry);
        }
    }
    if ADMIN.contains(&command) {
        help.push_str(&admin_note);
    }
    let paragraph = entries(section(&sections, "Commands:"), |line| {
        line.starts_with("  ") && !line.starts_with("   ")
    })
    .into_iter()
    .find(|entry| {
        let head = entry.trim_start().split("  ").next().unwrap_or("");
        head.split(", ").any(|name| name.trim() == command)
    });
    if let Some(paragraph) = paragraph {
        help.push('\n');
        help.push_str(&paragraph);
    }
    let mut title = command.to_string();
    title[..1].make_ascii_uppercase();
    let options = format!("{title} options:");
    if let Some(lines) = sections.iter().find(|(name, _)| *name == options) {
        help.push_str(&format!("\n{options}\n"));
        for line in &lines.1 {
            help.push_str(line);
            help.push('\n');
        }
    }
    help.push_str("\n(weft --help shows every command)\n");
    help
}

/// The usage text cut at its headings ("Usage:", "Commands:", "... options:").
fn sections(usage: &str) -> Vec<(&str, Vec<&str>)> {
    let mut sections: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in usage.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            sections.push((line, Vec::new()));
        } else if let Some((_, lines)) = sections.last_mut() {
            lines.push(line);
        }
    }
    sections
}

fn section<'a>(sections: &'a [(&str, Vec<&'a str>)], name: &str) -> &'a [&'a str] {
    sections
        .iter()
        .find(|(heading, _)| *heading == name)
        .map_or(&[], |(_, lines)| lines)
}

/// The section's entries: each starts at a line `starts` accepts (or at a
/// line after a blank one) and takes the more indented lines after it.
fn entries(lines: &[&str], starts: impl Fn(&str) -> bool) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    let mut open = false;
    for line in lines {
        if line.trim().is_empty() {
            open = false;
            continue;
        }
        if starts(line) || !open {
            entries.push(String::new());
            open = true;
        }
        let entry = entries.last_mut().expect("pushed");
        entry.push_str(line);
        entry.push('\n');
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    const USAGE: &str = "\
weft: test

Usage:
  weft serve [--config FILE]
             [--listen ADDR]

  weft pool create NAME --device PATH
                        [--force]
  weft pool list
  weft volume create NAME
      (admin commands talk to a running `weft serve`
       with its token)

  weft bench --target URL

Commands:
  pool, volume
          Carve pools.
  serve   Export block storage.
          Without --config: a file.

Bench options:
  --target URL   what to load

Serve options:
  --config FILE  the file
";

    #[test]
    fn a_command_gets_its_usage_paragraph_and_options() {
        let pool = for_command(USAGE, "pool");
        assert_eq!(
            pool,
            "Usage:\n  weft pool create NAME --device PATH\n                        [--force]\n  weft pool list\n      (admin commands talk to a running `weft serve`\n       with its token)\n\n  pool, volume\n          Carve pools.\n\n(weft --help shows every command)\n"
        );
        let serve = for_command(USAGE, "serve");
        assert!(serve.starts_with("Usage:\n  weft serve [--config FILE]\n             [--listen ADDR]\n\n  serve   Export"), "{serve}");
        assert!(
            serve.contains("Serve options:\n  --config FILE  the file\n"),
            "{serve}"
        );
        assert!(!serve.contains("admin commands"), "{serve}");
        let bench = for_command(USAGE, "bench");
        assert!(bench.contains("  weft bench --target URL\n"), "{bench}");
        assert!(bench.contains("Bench options:\n  --target URL"), "{bench}");
        assert!(!bench.contains("Carve"), "{bench}");
    }
}
