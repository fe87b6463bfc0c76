//! The minimum Rust versions the README states are true of the dependency tree: for each feature
//! set in its table, no crate the build compiles declares a newer `rust-version`. (Only the
//! project's one toolchain can be installed here, so the tree's declarations are what can be
//! checked.)

use std::collections::HashMap;
use std::process::Command;

/// One row of the README's table: the features it speaks of, and the Rust version it states.
struct Row {
    /// `None` for the default features.
    features: Vec<Option<String>>,
    rust: Version,
}

type Version = (u32, u32, u32);

fn parse_version(text: &str) -> Version {
    let mut parts = text
        .trim()
        .split('.')
        .map(|part| part.parse::<u32>().unwrap());
    let major = parts.next().unwrap();
    (major, parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

fn show((major, minor, patch): Version) -> String {
    format!("{major}.{minor}.{patch}")
}

fn cargo() -> Command {
    let mut command = Command::new(env!("CARGO"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

/// The table under "## Minimum Rust version" in the README.
fn readme_rows() -> Vec<Row> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## Minimum Rust version")
        .nth(1)
        .expect("the README has a minimum Rust version section");
    let mut rows = Vec::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() != 2 || cells[1].starts_with("---") || cells[1] == "Rust" {
            continue;
        }
        let mut features: Vec<Option<String>> = cells[0]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|feature| Some(feature.to_owned()))
            .collect();
        if cells[0].contains("default") {
            features.insert(0, None);
        }
        rows.push(Row {
            features,
            rust: parse_version(cells[1]),
        });
    }
    assert!(rows.len() >= 3, "the README's table was not found");
    rows
}

/// Every package's declared `rust-version`, by `name version`.
fn declared_versions() -> HashMap<String, Version> {
    let host = host();
    let output = run_cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--filter-platform",
        &host,
    ]);
    let metadata: serde_json::Value = serde_json::from_str(&output).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|package| {
            let rust = package["rust_version"].as_str()?;
            let id = format!(
                "{} v{}",
                package["name"].as_str()?,
                package["version"].as_str()?
            );
            Some((id, parse_version(rust)))
        })
        .collect()
}

fn host() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or("rustc".into());
    let version = Command::new(rustc).arg("-vV").output().unwrap().stdout;
    String::from_utf8(version)
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .unwrap()
        .to_owned()
}

/// Runs the cargo command `args` offline where it can (the build fetched everything), else
/// online.
fn run_cargo(args: &[&str]) -> String {
    let offline = cargo().args(args).arg("--offline").output().unwrap();
    let output = if offline.status.success() {
        offline
    } else {
        cargo().args(args).output().unwrap()
    };
    assert!(
        output.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The packages a build of `dlock-rs` with `feature` (on top of the defaults) compiles.
fn compiled_packages(feature: Option<&str>) -> Vec<String> {
    let host = host();
    let mut args = vec![
        "tree",
        "-p",
        "dlock-rs",
        "-e",
        "normal,build",
        "--prefix",
        "none",
    ];
    args.extend(["--format", "{p}", "--target", &host]);
    if let Some(feature) = feature {
        args.extend(["--features", feature]);
    }
    run_cargo(&args)
        .lines()
        .map(|line| {
            // `name vX.Y.Z (proc-macro) (/path) (*)`: keep `name vX.Y.Z`.
            line.split(' ').take(2).collect::<Vec<_>>().join(" ")
        })
        .collect()
}

#[test]
fn the_stated_minimum_rust_versions_hold_for_the_dependency_tree() {
    let rows = readme_rows();
    let declared = declared_versions();
    let package = declared["dlock-rs v0.1.0"];
    let default_row = rows
        .iter()
        .find(|row| row.features.contains(&None))
        .expect("a row for the default features");
    assert_eq!(
        package,
        default_row.rust,
        "Cargo.toml's rust-version is {}; the README states {} for the default features",
        show(package),
        show(default_row.rust)
    );
    let mut too_new = Vec::new();
    for row in &rows {
        for feature in &row.features {
            for compiled in compiled_packages(feature.as_deref()) {
                if let Some(&needs) = declared.get(&compiled) {
                    if needs > row.rust {
                        too_new.push(format!(
                            "{}: {compiled} needs Rust {}, the README states {}",
                            feature.as_deref().unwrap_or("default features"),
                            show(needs),
                            show(row.rust)
                        ));
                    }
                }
            }
        }
    }
    too_new.sort();
    too_new.dedup();
    assert!(too_new.is_empty(), "{}", too_new.join("\n"));
}
