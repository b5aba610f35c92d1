//! The man page and shell completions of a binary, generated from its own
//! clap definition so they never drift from `--help`. Both binaries expose
//! this as a hidden `generate-docs` subcommand; `cargo xtask package` and
//! `cargo xtask install` call it.
use std::path::{Path, PathBuf};

/// Why the files could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct DocsError {
    path: PathBuf,
    source: std::io::Error,
}

/// Writes into `out` (created if missing): `man/NAME.1` and one file per
/// subcommand `man/NAME-SUB.1`, and `completions/NAME.bash`, `_NAME` (zsh),
/// `NAME.fish`. Returns the files written.
pub fn write(command: clap::Command, out: &Path) -> Result<Vec<PathBuf>, DocsError> {
    use clap_complete::Shell;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| DocsError { path, source }
    };
    let man = out.join("man");
    let completions = out.join("completions");
    for dir in [&man, &completions] {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    // generate_to builds its own copy without the `help` subcommand.
    clap_mangen::generate_to(command.clone(), &man).map_err(io(&man))?;
    let mut command = command;
    command.build();
    let name = command.get_name().to_owned();
    let mut written = Vec::new();

    // One page per visible subcommand too (`NAME-SUB.1`), as git does.
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&man)
        .map_err(io(&man))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let stem = p.file_stem().unwrap_or_default().to_string_lossy();
            p.extension().is_some_and(|x| x == "1")
                && (stem == name || stem.starts_with(&format!("{name}-")))
        })
        .collect();
    pages.sort();
    written.extend(pages);

    for (shell, file) in [
        (Shell::Bash, format!("{name}.bash")),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let file = completions.join(file);
        let mut bytes = Vec::new();
        clap_complete::generate(shell, &mut command, &name, &mut bytes);
        std::fs::write(&file, bytes).map_err(io(&file))?;
        written.push(file);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_man_page_per_visible_subcommand_and_three_completions() {
        let out = std::env::temp_dir().join(format!("wr-docs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let command = clap::Command::new("demo")
            .about("a demo")
            .arg(clap::Arg::new("config").long("config"))
            .subcommand(clap::Command::new("run").about("run it"))
            .subcommand(clap::Command::new("secret").hide(true));
        let written = write(command, &out).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["demo-run.1", "demo.1", "demo.bash", "_demo", "demo.fish"]
        );
        let page = std::fs::read_to_string(out.join("man/demo.1")).unwrap();
        assert!(page.contains("\\-\\-config"), "{page}");
        let _ = std::fs::remove_dir_all(&out);
    }
}
