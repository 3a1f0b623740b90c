//! What the command line tells about itself, generated from the same clap definitions that parse
//! it: shell completions, man pages, and the command reference in `docs/commands.md` (a test
//! keeps that file equal to what [`markdown`] writes).

use clap::CommandFactory;
use std::fmt::Write as _;
use std::path::Path;

/// `synapse completions <shell>`: the completion script on standard output.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<i32> {
    let mut command = super::Cli::command();
    // Written here, not by clap_complete (which panics when the write fails).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "synapse", &mut script);
    print!("{}", String::from_utf8_lossy(&script));
    Ok(0)
}

/// `synapse man [--out DIR]`: the top page on standard output, or every page (`synapse.1`,
/// `synapse-send.1`, ...) written into DIR.
pub fn man(out: Option<&Path>) -> anyhow::Result<i32> {
    let command = super::Cli::command();
    match out {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command).render(&mut page)?;
            print!("{}", String::from_utf8_lossy(&page));
        }
        Some(dir) => {
            if dir.exists() && !dir.is_dir() {
                anyhow::bail!("--out names a directory for the pages, and {} is a file", dir.display());
            }
            std::fs::create_dir_all(dir)
                .map_err(|error| anyhow::anyhow!("cannot create {}: {error}", dir.display()))?;
            let mut written = 0;
            for (name, page) in pages(command) {
                let file = dir.join(format!("{name}.1"));
                let mut bytes = Vec::new();
                clap_mangen::Man::new(page)
                    .title(name.to_uppercase())
                    .source(format!("synapse {}", env!("CARGO_PKG_VERSION")))
                    .render(&mut bytes)?;
                std::fs::write(&file, bytes)
                    .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", file.display()))?;
                written += 1;
            }
            println!("Wrote {written} man pages to {}", dir.display());
        }
    }
    Ok(0)
}

/// Every visible command with its page name (`synapse`, `synapse-history-list`, ...).
fn pages(command: clap::Command) -> Vec<(String, clap::Command)> {
    fn walk(command: clap::Command, name: String, out: &mut Vec<(String, clap::Command)>) {
        let subcommands: Vec<clap::Command> =
            command.get_subcommands().filter(|sub| !sub.is_hide_set()).cloned().collect();
        out.push((name.clone(), command.clone()));
        for sub in subcommands {
            let sub_name = format!("{name}-{}", sub.get_name());
            // Its page is named as `man` finds it (synapse-send), and its synopsis shows the
            // command as typed.
            let bin_name = format!("{} {}", command.get_bin_name().unwrap_or("synapse"), sub.get_name());
            let sub = sub.name(sub_name.clone()).bin_name(bin_name);
            walk(sub, sub_name, out);
        }
    }
    let mut out = Vec::new();
    walk(command, "synapse".into(), &mut out);
    out
}

/// The command reference as Markdown: every visible command, its usage, what it does, and each
/// argument with its help.
pub fn markdown() -> String {
    let mut command = super::Cli::command();
    command.build();
    let mut out = String::from(
        "# Command reference\n\n<!-- Generated from the clap definitions by `synapse reference`; \
         tests/cli_ux.rs fails when this file differs. -->\n\n",
    );
    write_command(&mut out, &command, "synapse", 2);
    out
}

fn write_command(out: &mut String, command: &clap::Command, path: &str, depth: usize) {
    let _ = writeln!(out, "{} `{path}`\n", "#".repeat(depth.min(4)));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "{about}\n");
    }
    let usage = command.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ");
    let _ = writeln!(out, "```\n{}\n```\n", usage.trim());
    let arguments: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version"))
        .collect();
    if !arguments.is_empty() {
        for arg in arguments {
            let name = match (arg.get_short(), arg.get_long()) {
                (Some(short), Some(long)) => format!("-{short}, --{long}"),
                (None, Some(long)) => format!("--{long}"),
                (Some(short), None) => format!("-{short}"),
                (None, None) => format!("<{}>", arg.get_id().as_str().to_uppercase()),
            };
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let defaults: Vec<String> =
                arg.get_default_values().iter().map(|value| value.to_string_lossy().into_owned()).collect();
            let default = if defaults.is_empty() || arg.get_num_args().is_some_and(|n| n.max_values() == 0) {
                String::new()
            } else {
                format!(" (default: `{}`)", defaults.join(","))
            };
            let _ = writeln!(out, "- `{name}`: {}{default}", help.replace('\n', " "));
        }
        out.push('\n');
    }
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        write_command(out, sub, &format!("{path} {}", sub.get_name()), depth + 1);
    }
}
