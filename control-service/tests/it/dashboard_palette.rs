//! The console's colours stay apart for colour-blind operators: every pair of the colours the host
//! grid uses (lifetime classes, LAVA states, the empty part of a cell) is simulated under protanopia,
//! deuteranopia and tritanopia (Machado, Oliveira and Fernandes 2009, full severity) and must still
//! differ by a clear CIELAB distance. The colours are read from the dashboard's script itself, so a
//! palette change that makes two states look alike fails here.

use std::path::Path;

/// Full-severity simulation matrices on linear RGB (Machado et al. 2009).
const DEFICIENCIES: [(&str, [[f64; 3]; 3]); 3] = [
    ("protanopia", [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]),
    (
        "deuteranopia",
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    ),
    ("tritanopia", [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]]),
];

/// CIELAB distance (ΔE*ab) that the colours of a palette must keep under each deficiency. About 2
/// is just noticeable; 15 is plainly different at a glance, in cells of 7 px.
const MIN_DELTA_E: f64 = 15.0;

fn script() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/dashboard/app.js");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The `#rrggbb` colours on the script's line that starts with `const NAME =`.
fn colours(script: &str, name: &str) -> Vec<String> {
    let line = script
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("const {name} =")))
        .unwrap_or_else(|| panic!("app.js has no `const {name} =`"));
    let found: Vec<String> = line
        .match_indices('#')
        .filter_map(|(at, _)| line.get(at..at + 7))
        .filter(|hex| hex[1..].chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_owned)
        .collect();
    assert!(!found.is_empty(), "no colour on the line of {name}: {line}");
    found
}

fn linear(channel: u8) -> f64 {
    let c = f64::from(channel) / 255.0;
    if c <= 0.04045 {
        c / 12.92
    } else {
        ((c + 0.055) / 1.055).powf(2.4)
    }
}

fn rgb(hex: &str) -> [f64; 3] {
    let channel = |at: usize| linear(u8::from_str_radix(&hex[at..at + 2], 16).expect("hex colour"));
    [channel(1), channel(3), channel(5)]
}

/// Linear sRGB to CIELAB (D65).
fn lab([r, g, b]: [f64; 3]) -> [f64; 3] {
    let x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047;
    let y = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    let z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
    let f = |t: f64| if t > 0.008856 { t.cbrt() } else { 7.787 * t + 16.0 / 116.0 };
    [116.0 * f(y) - 16.0, 500.0 * (f(x) - f(y)), 200.0 * (f(y) - f(z))]
}

fn simulate(matrix: &[[f64; 3]; 3], colour: [f64; 3]) -> [f64; 3] {
    matrix.map(|row| (row[0] * colour[0] + row[1] * colour[1] + row[2] * colour[2]).clamp(0.0, 1.0))
}

fn delta_e(a: [f64; 3], b: [f64; 3]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt()
}

/// The closest pair of `palette` under any deficiency: (distance, deficiency, a, b).
fn closest_pair(palette: &[String]) -> (f64, &'static str, String, String) {
    let mut closest = (f64::INFINITY, "", String::new(), String::new());
    for (name, matrix) in &DEFICIENCIES {
        for (i, a) in palette.iter().enumerate() {
            for b in &palette[i + 1..] {
                let distance = delta_e(lab(simulate(matrix, rgb(a))), lab(simulate(matrix, rgb(b))));
                if distance < closest.0 {
                    closest = (distance, name, a.clone(), b.clone());
                }
            }
        }
    }
    closest
}

#[test]
fn the_grids_colours_stay_apart_under_colour_vision_deficiencies() {
    let script = script();
    let empty = colours(&script, "EMPTY");
    let classes = colours(&script, "CLASS_COLOURS");
    let lava = colours(&script, "LAVA_COLOURS");
    assert!(classes.len() >= 5, "LAVA has 5 lifetime classes and LA-multiclass up to 6: {classes:?}");
    for (what, palette) in [
        ("lifetime classes and the empty cell", [classes.clone(), empty.clone()].concat()),
        ("LAVA states and the empty cell", [lava, empty].concat()),
    ] {
        // A LAVA host in the empty state is drawn as an empty cell, on purpose: one colour.
        let mut palette: Vec<String> = palette.iter().map(|c| c.to_ascii_lowercase()).collect();
        palette.sort();
        palette.dedup();
        let (distance, deficiency, a, b) = closest_pair(&palette);
        eprintln!("{what}: closest pair {a} / {b} under {deficiency}, ΔE {distance:.1}");
        assert!(
            distance >= MIN_DELTA_E,
            "{what}: {a} and {b} are {distance:.1} apart under {deficiency} (at least {MIN_DELTA_E})"
        );
    }
}

/// The check itself tells a red/green pair apart from a good one.
#[test]
fn a_red_green_pair_fails_the_check() {
    let (distance, deficiency, _, _) = closest_pair(&["#d62728".to_owned(), "#2ca02c".to_owned()]);
    assert!(distance < MIN_DELTA_E, "red and green stay {distance:.1} apart under {deficiency}");
    let (distance, _, _, _) = closest_pair(&["#0072B2".to_owned(), "#E69F00".to_owned()]);
    assert!(distance >= MIN_DELTA_E, "blue and orange are only {distance:.1} apart");
}
