//! Talking to Docker: finding the compose tool, running compose commands for
//! one project, and reading containers (state, labels, files, logs).
//!
//! Everything goes through the `docker` and compose command-line tools rather
//! than the Engine API: they are what a user has, and what they print is what
//! the user would see.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::compose::{ADDRESS_LABEL, NODE_LABEL, SHAPE_LABEL};
use crate::node_line::{node_index, node_name};

/// Errors of running docker or compose.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error(
        "no compose tool found: neither `docker compose` nor `docker-compose` runs \
         (install the compose plugin or docker-compose, or set SLOWMO_COMPOSE)"
    )]
    NoCompose,
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("compose file {0} does not exist (write one with `slowmo-testnet compose`)")]
    NoFile(PathBuf),
    #[error(
        "project name `{0}`: use lowercase letters, digits, `-` and `_`, starting with a letter or digit"
    )]
    BadProject(String),
    #[error("no node `{name}` in this testnet (nodes: {known})")]
    UnknownNode { name: String, known: String },
}

/// Runs a command and returns its output, failing on a non-zero exit.
pub fn run_output(cmd: &mut Command) -> Result<Output, DockerError> {
    let command = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| DockerError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(DockerError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Runs a command with the terminal's stdout/stderr, failing on a non-zero exit.
pub fn run_inherit(cmd: &mut Command) -> Result<(), DockerError> {
    let command = describe(cmd);
    let status = cmd.status().map_err(|source| DockerError::Spawn {
        command: command.clone(),
        source,
    })?;
    if !status.success() {
        return Err(DockerError::Failed {
            command,
            status: status.to_string(),
            stderr: "(printed above)".into(),
        });
    }
    Ok(())
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Whether a Docker Engine answers.
pub fn engine_available() -> Result<(), String> {
    let out = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `docker`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The compose tool's command prefix: `$SLOWMO_COMPOSE` (split on spaces),
/// else `docker compose` when the plugin is installed, else `docker-compose`.
pub fn compose_command() -> Result<Vec<String>, DockerError> {
    if let Ok(tool) = std::env::var("SLOWMO_COMPOSE")
        && !tool.trim().is_empty()
    {
        return Ok(tool.split_whitespace().map(str::to_string).collect());
    }
    let answers = |argv: &[&str]| {
        Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if answers(&["docker", "compose", "version"]) {
        Ok(vec!["docker".into(), "compose".into()])
    } else if answers(&["docker-compose", "version"]) {
        Ok(vec!["docker-compose".into()])
    } else {
        Err(DockerError::NoCompose)
    }
}

/// Checks a project name the way compose accepts it.
pub fn check_project(name: &str) -> Result<(), DockerError> {
    let ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(DockerError::BadProject(name.to_string()))
    }
}

/// One compose project: a compose file and a project name.
#[derive(Debug, Clone)]
pub struct Project {
    tool: Vec<String>,
    pub file: PathBuf,
    pub name: String,
}

/// A node's container as Docker sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
    pub service: String,
    /// created, running, paused, restarting, exited, dead.
    pub status: String,
    pub exit_code: i64,
    pub address: Option<String>,
    pub shape: Option<String>,
}

impl Project {
    /// A project for an existing compose file.
    pub fn new(file: &Path, name: &str) -> Result<Self, DockerError> {
        check_project(name)?;
        if !file.is_file() {
            return Err(DockerError::NoFile(file.to_owned()));
        }
        Ok(Project {
            tool: compose_command()?,
            file: file.to_owned(),
            name: name.to_string(),
        })
    }

    /// `compose -f FILE -p NAME ARGS...`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.tool[0]);
        cmd.args(&self.tool[1..])
            .arg("-f")
            .arg(&self.file)
            .arg("-p")
            .arg(&self.name)
            .args(args);
        cmd
    }

    /// The services of the compose file, node-0 first.
    pub fn services(&self) -> Result<Vec<String>, DockerError> {
        let out = run_output(&mut self.command(&["config", "--services"]))?;
        let mut services: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        services.sort_by_key(|s| (node_index(s).unwrap_or(usize::MAX), s.clone()));
        Ok(services)
    }

    /// Resolves a node given as `node-2` or `2` against the services.
    pub fn node(&self, name: &str) -> Result<String, DockerError> {
        let services = self.services()?;
        let wanted = match name.parse::<usize>() {
            Ok(i) if name.chars().all(|c| c.is_ascii_digit()) => node_name(i),
            _ => name.to_string(),
        };
        if services.contains(&wanted) {
            Ok(wanted)
        } else {
            Err(DockerError::UnknownNode {
                name: name.to_string(),
                known: services.join(", "),
            })
        }
    }

    /// The containers of this project (running or not), by service name.
    pub fn containers(&self) -> Result<Vec<ContainerInfo>, DockerError> {
        let out = run_output(Command::new("docker").args([
            "ps",
            "-a",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.name),
        ]))?;
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let format = format!(
            "{{{{.Id}}}}\t{{{{index .Config.Labels \"com.docker.compose.service\"}}}}\t{{{{.State.Status}}}}\t\
             {{{{.State.ExitCode}}}}\t{{{{index .Config.Labels \"{ADDRESS_LABEL}\"}}}}\t\
             {{{{index .Config.Labels \"{SHAPE_LABEL}\"}}}}\t{{{{index .Config.Labels \"{NODE_LABEL}\"}}}}"
        );
        let out = run_output(
            Command::new("docker")
                .args(["inspect", "--format", &format])
                .args(&ids),
        )?;
        let mut infos: Vec<ContainerInfo> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split('\t').collect();
                if f.len() < 6 {
                    return None;
                }
                let nonempty =
                    |s: &str| (!s.is_empty() && s != "<no value>").then(|| s.to_string());
                Some(ContainerInfo {
                    id: f[0].to_string(),
                    service: f[1].to_string(),
                    status: f[2].to_string(),
                    exit_code: f[3].parse().unwrap_or(-1),
                    address: nonempty(f[4]),
                    shape: nonempty(f[5]),
                })
            })
            .collect();
        infos.sort_by_key(|c| {
            (
                node_index(&c.service).unwrap_or(usize::MAX),
                c.service.clone(),
            )
        });
        Ok(infos)
    }

    /// Names of the networks and volumes Docker still holds for this project.
    pub fn leftovers(&self) -> Result<Vec<String>, DockerError> {
        let label = format!("label=com.docker.compose.project={}", self.name);
        let mut left = Vec::new();
        for (kind, args) in [
            (
                "container",
                vec!["ps", "-a", "-q", "--filter", label.as_str()],
            ),
            (
                "network",
                vec!["network", "ls", "-q", "--filter", label.as_str()],
            ),
            (
                "volume",
                vec!["volume", "ls", "-q", "--filter", label.as_str()],
            ),
        ] {
            let out = run_output(Command::new("docker").args(&args))?;
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                left.push(format!("{kind} {id}"));
            }
        }
        Ok(left)
    }
}

/// Reads one file out of a container (running, paused or exited) through
/// `docker cp CONTAINER:PATH -`; `None` when the file does not exist.
pub fn read_file(container: &str, path: &str) -> Result<Option<Vec<u8>>, DockerError> {
    let mut cmd = Command::new("docker");
    cmd.args(["cp", &format!("{container}:{path}"), "-"]);
    match run_output(&mut cmd) {
        Ok(out) => Ok(first_tar_entry(&out.stdout)),
        Err(DockerError::Failed { stderr, .. })
            if stderr.contains("No such container:path")
                || stderr.contains("Could not find the file") =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The content of the first regular file in a tar stream.
pub fn first_tar_entry(tar: &[u8]) -> Option<Vec<u8>> {
    let mut offset = 0;
    while offset + 512 <= tar.len() {
        let header = &tar[offset..offset + 512];
        if header.iter().all(|&b| b == 0) {
            return None;
        }
        let size_field = std::str::from_utf8(&header[124..136]).ok()?;
        let size =
            usize::from_str_radix(size_field.trim_matches(|c: char| c == '\0' || c == ' '), 8)
                .ok()?;
        let kind = header[156];
        let start = offset + 512;
        let end = start.checked_add(size)?;
        if (kind == b'0' || kind == 0) && end <= tar.len() {
            return Some(tar[start..end].to_vec());
        }
        offset = start + size.div_ceil(512) * 512;
    }
    None
}

/// Runs a command inside a running container, feeding `stdin`.
pub fn exec(container: &str, args: &[&str], stdin: &str) -> Result<Output, DockerError> {
    let mut cmd = Command::new("docker");
    cmd.args(["exec", "-i", container]).args(args);
    let command = describe(&cmd);
    let spawn_err = |source| DockerError::Spawn {
        command: command.clone(),
        source,
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(DockerError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Writes a container's log (stdout and stderr, interleaved as Docker keeps
/// them) to `path`.
pub fn save_logs(container: &str, path: &Path) -> Result<(), DockerError> {
    let file = std::fs::File::create(path).map_err(|source| DockerError::Spawn {
        command: format!("create {}", path.display()),
        source,
    })?;
    let err_file = file.try_clone().map_err(|source| DockerError::Spawn {
        command: format!("create {}", path.display()),
        source,
    })?;
    let mut cmd = Command::new("docker");
    cmd.args(["logs", "--timestamps", container])
        .stdout(file)
        .stderr(err_file);
    run_inherit(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(name: &str, content: &[u8]) -> Vec<u8> {
        let mut header = [0u8; 512];
        header[..name.len()].copy_from_slice(name.as_bytes());
        let size = format!("{:011o}\0", content.len());
        header[124..136].copy_from_slice(size.as_bytes());
        header[156] = b'0';
        let mut tar = header.to_vec();
        tar.extend_from_slice(content);
        tar.resize(512 + content.len().div_ceil(512) * 512 + 1024, 0);
        tar
    }

    #[test]
    fn reads_the_file_out_of_a_tar_stream() {
        let content = b"{\"step\":1}\n{\"step\":2}\n".repeat(40);
        assert_eq!(
            first_tar_entry(&tar_with("metrics.jsonl", &content)),
            Some(content)
        );
        assert_eq!(first_tar_entry(&tar_with("empty", b"")), Some(Vec::new()));
        assert_eq!(first_tar_entry(&[0u8; 1024]), None);
        let mut truncated = tar_with("x", &[7u8; 600]);
        truncated.truncate(700);
        assert_eq!(first_tar_entry(&truncated), None);
    }

    #[test]
    fn project_names_follow_compose_rules() {
        assert!(check_project("slowmo-lan_1").is_ok());
        for bad in ["", "Slowmo", "-x", "a b", "a.b"] {
            let err = check_project(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn node_indices_sort_numerically() {
        assert_eq!(node_index("node-10"), Some(10));
        assert_eq!(node_index("node-x"), None);
        let mut names = vec!["node-10", "node-2", "node-1"];
        names.sort_by_key(|s| node_index(s));
        assert_eq!(names, vec!["node-1", "node-2", "node-10"]);
    }
}
