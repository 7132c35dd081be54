//! Phases as tables (per-hub median and max, fleet total) and as JSON.

use serde_json::{Map, Value, json};

/// How a row's numbers read.
#[derive(Clone, Copy)]
pub enum Unit {
    Count,
    Bytes,
    Seconds,
    MiB,
}

impl Unit {
    fn format(self, v: f64) -> String {
        if !v.is_finite() {
            return "-".into();
        }
        match self {
            Unit::Count => format!("{v:.0}"),
            Unit::Seconds => format!("{v:.1} s"),
            Unit::MiB => format!("{v:.1} MiB"),
            Unit::Bytes if v >= 1024.0 * 1024.0 => format!("{:.2} MiB", v / 1048576.0),
            Unit::Bytes if v >= 1024.0 => format!("{:.1} KiB", v / 1024.0),
            Unit::Bytes => format!("{v:.0} B"),
        }
    }
}

/// One per-hub figure: a value per hub.
pub struct Row {
    pub name: &'static str,
    pub unit: Unit,
    pub values: Vec<f64>,
    /// Whether a fleet total means anything (connections do, RSS does not).
    pub summed: bool,
}

impl Row {
    pub fn new(name: &'static str, unit: Unit, values: Vec<f64>) -> Row {
        Row {
            name,
            unit,
            values,
            summed: true,
        }
    }

    pub fn unsummed(mut self) -> Row {
        self.summed = false;
        self
    }

    fn median(&self) -> f64 {
        percentile(&self.values, 0.5)
    }

    fn max(&self) -> f64 {
        self.values.iter().copied().fold(f64::NAN, f64::max)
    }

    fn total(&self) -> f64 {
        self.values.iter().sum()
    }
}

/// The value at quantile `q` (nearest rank) of `values`; NaN when empty.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// One phase of the run.
pub struct Phase {
    pub name: String,
    pub seconds: f64,
    pub rows: Vec<Row>,
    /// Fleet-wide figures: name, human text, JSON value.
    pub fleet: Vec<(String, String, Value)>,
}

impl Phase {
    pub fn new(name: impl Into<String>, seconds: f64) -> Phase {
        Phase {
            name: name.into(),
            seconds,
            rows: Vec::new(),
            fleet: Vec::new(),
        }
    }

    pub fn note(&mut self, name: impl Into<String>, text: impl Into<String>, value: Value) {
        self.fleet.push((name.into(), text.into(), value));
    }

    pub fn table(&self) -> String {
        let mut out = format!("\n== {} ({:.0} s) ==\n", self.name, self.seconds);
        out += &format!(
            "{:<44} {:>14} {:>14} {:>14}\n",
            "per hub", "median", "max", "fleet total"
        );
        for row in &self.rows {
            let total = if row.summed {
                row.unit.format(row.total())
            } else {
                "-".into()
            };
            out += &format!(
                "{:<44} {:>14} {:>14} {:>14}\n",
                row.name,
                row.unit.format(row.median()),
                row.unit.format(row.max()),
                total
            );
        }
        for (name, text, _) in &self.fleet {
            out += &format!("{name:<44} {text}\n");
        }
        out
    }

    pub fn json(&self) -> Value {
        let mut per_hub = Map::new();
        for row in &self.rows {
            per_hub.insert(
                row.name.to_owned(),
                json!({
                    "median": finite(row.median()),
                    "max": finite(row.max()),
                    "total": if row.summed { finite(row.total()) } else { Value::Null },
                    "values": row.values.iter().map(|v| finite(*v)).collect::<Vec<_>>(),
                }),
            );
        }
        let fleet: Map<String, Value> = self
            .fleet
            .iter()
            .map(|(name, _, value)| (name.clone(), value.clone()))
            .collect();
        json!({"name": self.name, "seconds": self.seconds, "per_hub": per_hub, "fleet": fleet})
    }
}

fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}
