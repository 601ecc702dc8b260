//! The borrow contracts are proven at compile time, and this checks that each proof refuses what
//! it says it refuses, for that reason.
//!
//! Every ```` ```compile_fail,E…```` example in the library's docs names the errors it must give:
//! their codes after `compile_fail`, and an error rustc gives without a code (a lifetime error,
//! say) as a comment on the line that causes it, `// error: <rustc's message>`. Rustdoc compiles
//! the examples too, but on stable Rust it passes any compile error — a typo would pass as a
//! refused misuse. Here each example is compiled against the library as rustdoc would (its
//! hidden `# ` lines kept, wrapped in `main`) with `rustc --emit=metadata` (type and borrow
//! checking, no code), and must fail with exactly the errors it names: no other. An example that
//! names none fails the test.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One compile-fail example: where it stands, the codes it names, its program.
struct Example {
    at: String,
    codes: Vec<String>,
    body: Vec<String>,
}

impl Example {
    /// The errors without a code it names (`// error: <message>` comments).
    fn messages(&self) -> Vec<String> {
        let mut named: Vec<String> = self
            .body
            .iter()
            .filter_map(|l| {
                l.split_once("// error: ")
                    .map(|(_, m)| m.trim().to_string())
            })
            .collect();
        named.sort();
        named.dedup();
        named
    }
}

/// Every compile-fail example in the doc comments of `source` (a file's text; `file` names it).
fn examples_in(file: &str, source: &str) -> Vec<Example> {
    let mut found = Vec::new();
    let mut open: Option<Example> = None;
    for (index, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        let Some(doc) = trimmed
            .strip_prefix("///")
            .or_else(|| trimmed.strip_prefix("//!"))
        else {
            continue;
        };
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        match &mut open {
            None => {
                if let Some(attributes) = doc.strip_prefix("```compile_fail") {
                    let codes = attributes
                        .split(',')
                        .map(str::trim)
                        .filter(|a| a.starts_with('E'))
                        .map(String::from)
                        .collect();
                    open = Some(Example {
                        at: format!("{file}:{}", index + 1),
                        codes,
                        body: Vec::new(),
                    });
                }
            }
            Some(example) => {
                if doc.starts_with("```") {
                    found.extend(open.take());
                } else {
                    let shown = match doc.strip_prefix('#') {
                        Some(hidden) if hidden.is_empty() || hidden.starts_with(' ') => {
                            hidden.strip_prefix(' ').unwrap_or(hidden)
                        }
                        _ => doc,
                    };
                    example.body.push(shown.to_string());
                }
            }
        }
    }
    assert!(
        open.is_none(),
        "{file}: a compile_fail example is not closed"
    );
    found
}

/// The example as a program, as rustdoc wraps it: in `main`, and where its last line is
/// `Ok::<(), E>(())`, in a function returning `Result<(), E>` that `main` calls.
fn program(example: &Example) -> String {
    let body = example.body.join("\n");
    let last = example.body.iter().rev().find(|l| !l.trim().is_empty());
    let error_type = last
        .and_then(|l| l.trim().strip_prefix("Ok::<(), "))
        .and_then(|rest| rest.strip_suffix(">(())"));
    match error_type {
        Some(error) => format!(
            "#![allow(unused)]\nfn main() {{\n    fn _example() -> Result<(), {error}> {{\n{body}\n    }}\n    let _ = _example();\n}}\n"
        ),
        None => format!("#![allow(unused)]\nfn main() {{\n{body}\n}}\n"),
    }
}

/// The library this test was built against, and the folder of its dependencies: the newest
/// `libringreduce-*.rlib` beside this test's executable (cargo puts both in `target/<profile>/deps`).
fn library() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test's folder").to_path_buf();
    let newest = std::fs::read_dir(&deps)
        .expect("the deps folder")
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libringreduce-") && name.ends_with(".rlib")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, path)| path)
        .expect("libringreduce-*.rlib beside the test executable");
    (newest, deps)
}

/// The error codes rustc gave (`error[E0499]`), and its errors without a code (beyond the
/// closing "aborting due to" line).
fn errors(stderr: &str) -> (Vec<String>, Vec<String>) {
    let (mut codes, mut uncoded) = (Vec::new(), Vec::new());
    for line in stderr.lines() {
        if let Some(rest) = line.strip_prefix("error[") {
            codes.extend(rest.split(']').next().map(String::from));
        } else if let Some(rest) = line.strip_prefix("error: ") {
            if !rest.starts_with("aborting due to") {
                uncoded.push(rest.to_string());
            }
        }
    }
    for list in [&mut codes, &mut uncoded] {
        list.sort();
        list.dedup();
    }
    (codes, uncoded)
}

/// Compiles `source` against the library (type and borrow checks only); returns rustc's stderr,
/// or `None` where it compiled.
fn compile(source: &str, name: &str, library: &(PathBuf, PathBuf)) -> Option<String> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile_fail");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let file = dir.join(format!("{name}.rs"));
    std::fs::write(&file, source).expect("the example's file");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "bin",
            "--emit=metadata",
        ])
        .arg("--crate-name")
        .arg(name)
        .arg("--out-dir")
        .arg(&dir)
        .arg("--extern")
        .arg(format!("ringreduce={}", library.0.display()))
        .arg("-L")
        .arg(format!("dependency={}", library.1.display()))
        .arg(&file)
        .output()
        .expect("rustc runs (the toolchain that built this test)");
    (!output.status.success()).then(|| String::from_utf8_lossy(&output.stderr).into_owned())
}

/// What is wrong with one example: `None` where it fails with exactly the errors it names.
fn verdict(example: &Example, stderr: Option<&str>) -> Option<String> {
    let mut named = example.codes.clone();
    named.sort();
    let messages = example.messages();
    if named.is_empty() && messages.is_empty() {
        return Some("names no error (```compile_fail,E0XXX, or // error: <message>)".into());
    }
    let Some(stderr) = stderr else {
        return Some(format!(
            "compiles; it should fail with {named:?} {messages:?}"
        ));
    };
    let (codes, uncoded) = errors(stderr);
    (codes != named || uncoded != messages).then(|| {
        format!("fails with {codes:?} {uncoded:?} where it names {named:?} {messages:?}:\n{stderr}")
    })
}

/// The library's sources, every `.rs` file under `src/`.
fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/").filter_map(|e| e.ok()) {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn every_compile_fail_example_fails_with_the_error_it_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    files.sort();
    let mut examples = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let name = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        examples.extend(examples_in(&name, &text));
    }
    // The library documents at least this many refused misuses (GpuBuffer's, Scope's,
    // registration's): fewer found means the examples moved or this reader broke.
    assert!(
        examples.len() >= 19,
        "found {} compile_fail examples",
        examples.len()
    );
    let library = library();
    // Two at a time (CI's machine has two cores).
    let results: Vec<(usize, Option<String>)> = std::thread::scope(|scope| {
        let (examples, library) = (&examples, &library);
        let halves = [0, 1].map(|half| {
            scope.spawn(move || {
                (half..examples.len())
                    .step_by(2)
                    .map(|i| {
                        (
                            i,
                            compile(&program(&examples[i]), &format!("example_{i}"), library),
                        )
                    })
                    .collect::<Vec<_>>()
            })
        });
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("a compiling thread"))
            .collect()
    });
    let wrong: Vec<String> = results
        .iter()
        .filter_map(|(i, stderr)| {
            let example = &examples[*i];
            verdict(example, stderr.as_deref()).map(|why| format!("{}: {why}", example.at))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} compile_fail examples:\n{}",
        wrong.len(),
        examples.len(),
        wrong.join("\n")
    );
}

/// The checker itself: a program that compiles, one that fails with another code, and one with
/// no code named are each reported; the right code passes.
#[test]
fn the_verdict_names_what_does_not_match() {
    let with = |codes: &[&str]| Example {
        at: "here".into(),
        codes: codes.iter().map(|c| c.to_string()).collect(),
        body: Vec::new(),
    };
    let stderr = "error[E0499]: cannot borrow `a` as mutable more than once at a time\nerror: aborting due to 1 previous error\n";
    assert!(verdict(&with(&["E0499"]), Some(stderr)).is_none());
    assert!(verdict(&with(&["E0505"]), Some(stderr)).is_some());
    assert!(verdict(&with(&[]), Some(stderr)).is_some());
    assert!(verdict(&with(&["E0499"]), None).is_some());
    let uncoded = "error: expected one of `.`, `;`\nerror[E0499]: x\n";
    assert!(verdict(&with(&["E0499"]), Some(uncoded)).is_some());
    let lifetime =
        "error: lifetime may not live long enough\nerror: aborting due to 1 previous error\n";
    let mut escape = with(&[]);
    escape.body = vec!["let s = f(|s| s); // error: lifetime may not live long enough".into()];
    assert!(verdict(&escape, Some(lifetime)).is_none());
    assert!(verdict(&escape, Some(stderr)).is_some());
    let doc = "/// ```compile_fail,E0133\n/// # fn f() {\n/// let x = 1;\n/// # }\n/// ```\n";
    let found = examples_in("f.rs", doc);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].codes, ["E0133"]);
    assert_eq!(found[0].body, ["fn f() {", "let x = 1;", "}"]);
}
