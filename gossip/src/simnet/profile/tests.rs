//! Parsing and validation of network profiles.

use super::*;

const EXAMPLE: &str = r#"
    description = "example"
    compute_ms = 2.0
    [default]
    delay = "5ms"
    jitter = "1ms"
    rate = "1gbit"
    loss = 0.0
    [node.3]
    slowdown = 3.0
    rate = "100mbit"
    [link."0->2"]
    delay = "50ms"
    rate = "20mbit"
    [link." 3 -> 1 "]
    loss = 0.5
    [[fault]]
    kind = "crash"
    node = 3
    at_step = 200
    [[fault]]
    kind = "pause"
    node = 1
    at_step = 10
    steps = 5
    [[fault]]
    kind = "partition"
    groups = [[0, 1], [2]]
    from_step = 300
    to_step = 500
"#;

#[test]
fn example_parses_and_settings_layer_link_over_sender_over_default() {
    let p = NetworkProfile::from_toml(EXAMPLE).unwrap();
    p.validate(4).unwrap();
    assert_eq!(p.description, "example");
    assert!((p.compute_s - 0.002).abs() < 1e-15);
    assert_eq!(p.node(3).cpu_slowdown, Some(3.0));
    assert_eq!(p.node(0).cpu_slowdown, None);
    let long = p.link(0, 2);
    assert_eq!(long.delay_s, Some(0.05));
    assert_eq!(long.rate_bit_s, Some(20e6));
    assert_eq!(long.jitter_s, Some(0.001));
    assert_eq!(p.link(2, 0).delay_s, Some(0.005));
    assert_eq!(p.link(3, 0).rate_bit_s, Some(100e6));
    let lossy = p.link(3, 1);
    assert_eq!((lossy.loss, lossy.rate_bit_s), (Some(0.5), Some(100e6)));
    assert_eq!(
        p.faults,
        vec![
            Fault::Crash {
                node: 3,
                at_step: 200
            },
            Fault::Pause {
                node: 1,
                at_step: 10,
                steps: 5
            },
            Fault::Partition {
                groups: vec![vec![0, 1], vec![2]],
                from_step: 300,
                to_step: 500
            },
        ]
    );
}

#[test]
fn an_empty_profile_has_no_delay_and_unlimited_links() {
    let p = NetworkProfile::from_toml("compute_ms = 0").unwrap();
    assert_eq!(p.link(0, 1), LinkSettings::default());
    assert!(p.faults.is_empty());
}

#[test]
fn durations_and_rates_take_tc_units() {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-9);
    for (text, seconds) in [
        ("5ms", 5e-3),
        ("1.5 s", 1.5),
        ("250us", 250e-6),
        ("7ns", 7e-9),
        ("0ms", 0.0),
    ] {
        assert!(close(parse_duration(text).unwrap(), seconds), "{text}");
    }
    for (text, bits) in [
        ("20mbit", 20e6),
        ("1Gbit", 1e9),
        ("64kbit", 64e3),
        ("9600bit", 9600.0),
        ("2tbit", 2e12),
    ] {
        assert!(close(parse_rate(text).unwrap(), bits), "{text}");
    }
    for bad in ["5", "ms", "5 parsecs", "-1ms", "infms", "5m s"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
    for bad in ["20", "20mbps", "0mbit", "-3kbit", "mbit"] {
        assert!(parse_rate(bad).is_err(), "{bad}");
    }
}

#[test]
fn parse_errors_name_the_key() {
    let bad_compute = [
        ("compute_ms = -1", "compute_ms"),
        ("compute_ms = nan", "compute_ms"),
        ("description = \"none\"", "compute_ms"),
    ];
    // Each body follows a valid `compute_ms = 1`.
    let bodies = [
        ("speed = 3", "speed"),
        ("[default]\ndelay = \"5 parsecs\"", "default.delay"),
        ("[default]\ndelay = 5", "\"5ms\""),
        ("[default]\njitter = \"-1ms\"", "default.jitter"),
        ("[default]\nrate = \"20mbps\"", "default.rate"),
        ("[default]\nloss = 1.0", "default.loss"),
        ("[default]\nloss = -0.1", "default.loss"),
        ("[default]\ncpu_slowdown = 0", "default.cpu_slowdown"),
        ("[node.x]\ncpu_slowdown = 2", "node.x"),
        ("[node.2]\nrate = \"0gbit\"", "node.2.rate"),
        ("[link.\"0-2\"]\nloss = 0.1", "link.\"0-2\""),
        ("[link.\"1->1\"]\nloss = 0.1", "link.\"1->1\""),
        ("[link.\"0->2\"]\ncpu_slowdown = 2", "cpu_slowdown"),
        ("[link.\"0->2\"]\ndelay = \"1 h\"", "link.\"0->2\".delay"),
        ("[[fault]]\nkind = \"meltdown\"", "fault[0].kind"),
        ("[[fault]]\nkind = \"crash\"\nat_step = 3", "fault[0].node"),
        ("[[fault]]\nkind = \"crash\"\nnode = 1", "fault[0].at_step"),
        (
            "[[fault]]\nkind = \"crash\"\nnode = -1\nat_step = 3",
            "node",
        ),
        (
            "[[fault]]\nkind = \"crash\"\nnode = 1\nat_step = 3\nsteps = 2",
            "fault[0].steps",
        ),
        (
            "[[fault]]\nkind = \"pause\"\nnode = 1\nat_step = 3\nsteps = 0",
            "fault[0].steps",
        ),
        (
            "[[fault]]\nkind = \"pause\"\nnode = 1\nat_step = 3",
            "fault[0].steps",
        ),
        (
            "[[fault]]\nkind = \"partition\"\nfrom_step = 1\nto_step = 2",
            "fault[0].groups",
        ),
        (
            "[[fault]]\nkind = \"partition\"\ngroups = [[0]]\nfrom_step = 5\nto_step = 5",
            "fault[0].to_step",
        ),
        (
            "[[fault]]\nkind = \"partition\"\ngroups = [[0, 1], [1]]\nfrom_step = 1\nto_step = 2",
            "fault[0].groups",
        ),
        (
            "[[fault]]\nkind = \"partition\"\ngroups = [[]]\nfrom_step = 1\nto_step = 2",
            "fault[0].groups",
        ),
        (
            "[[fault]]\nkind = \"partition\"\ngroups = [[0]]\nnode = 1\nfrom_step = 1\nto_step = 2",
            "fault[0].node",
        ),
    ];
    let cases = bad_compute
        .into_iter()
        .map(|(text, key)| (text.to_string(), key))
        .chain(
            bodies
                .into_iter()
                .map(|(body, key)| (format!("compute_ms = 1\n{body}"), key)),
        );
    for (text, key) in cases {
        let err = NetworkProfile::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("inline") && err.contains(key),
            "{text}\n=> {err}"
        );
    }
}

#[test]
fn validation_checks_indices_against_the_world_size() {
    let cases = [
        ("[node.7]\ncpu_slowdown = 2", "node.7", "node 7"),
        ("[link.\"0->9\"]\nloss = 0.1", "link.\"0->9\"", "node 9"),
        ("[link.\"4->0\"]\nloss = 0.1", "link.\"4->0\"", "node 4"),
        (
            "[[fault]]\nkind = \"crash\"\nnode = 5\nat_step = 1",
            "fault[0].node",
            "node 5",
        ),
        (
            "[[fault]]\nkind = \"pause\"\nnode = 4\nat_step = 1\nsteps = 1",
            "fault[0].node",
            "node 4",
        ),
        (
            "[[fault]]\nkind = \"partition\"\ngroups = [[0], [4]]\nfrom_step = 1\nto_step = 2",
            "fault[0].groups",
            "node 4",
        ),
    ];
    for (body, key, node) in cases {
        let p = NetworkProfile::from_toml(&format!("compute_ms = 1\n{body}")).unwrap();
        let err = p.validate(4).unwrap_err().to_string();
        assert!(
            err.contains(key) && err.contains(node) && err.contains("0..=3"),
            "{body}\n=> {err}"
        );
        p.validate(10).unwrap();
    }
}

#[test]
fn files_are_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net.toml");
    let err = NetworkProfile::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("net.toml") && err.contains("cannot read"),
        "{err}"
    );
    std::fs::write(&path, "compute_ms = 1\n[default]\nloss = 2").unwrap();
    let err = NetworkProfile::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("net.toml") && err.contains("default.loss"),
        "{err}"
    );
    std::fs::write(&path, EXAMPLE).unwrap();
    let p = NetworkProfile::from_file(&path).unwrap();
    assert_eq!(p.name, path.display().to_string());
}

#[test]
fn a_profile_embeds_in_a_larger_toml_document() {
    #[derive(Debug, serde::Deserialize)]
    struct Run {
        network: NetworkProfile,
    }
    let run: Run =
        toml::from_str("[network]\ncompute_ms = 3\n[network.node.1]\nslowdown = 2").unwrap();
    assert_eq!(run.network.node(1).cpu_slowdown, Some(2.0));
    let err = toml::from_str::<Run>("[network]\ncompute_ms = 3\n[network.default]\nloss = 7")
        .unwrap_err()
        .to_string();
    assert!(err.contains("default.loss"), "{err}");
}
