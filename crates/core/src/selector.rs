//! Label and field selectors (provisional compact version; replaced by the full implementation).

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelSelector {
    reqs: Vec<(String, Op)>,
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            reqs.push(parse_label_term(t)?);
        }
        Ok(LabelSelector { reqs })
    }
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
    pub fn matches(&self, labels: &dyn Fn(&str) -> Option<String>) -> bool {
        self.reqs.iter().all(|(k, op)| {
            let v = labels(k);
            match op {
                Op::Eq(x) => v.as_deref() == Some(x),
                Op::NotEq(x) => v.as_deref() != Some(x),
                Op::In(xs) => v.is_some_and(|v| xs.contains(&v)),
                Op::NotIn(xs) => !v.is_some_and(|v| xs.contains(&v)),
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
            }
        })
    }
    pub fn matches_json(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.matches(&|k| labels.and_then(|m| m.get(k)).and_then(|v| v.as_str()).map(str::to_owned))
    }
}

fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn parse_label_term(t: &str) -> Result<(String, Op), SelectorError> {
    let err = || SelectorError(format!("unable to parse requirement: {t:?}"));
    if let Some(k) = t.strip_prefix('!') {
        let k = k.trim();
        return if valid_token(k) { Ok((k.into(), Op::NotExists)) } else { Err(err()) };
    }
    for (sep, neg) in [(" notin ", true), (" in ", false)] {
        if let Some((k, rest)) = t.split_once(sep) {
            let rest = rest.trim();
            let inner = rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(err)?;
            let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
            if !valid_token(k.trim()) || vals.iter().any(|v| !v.is_empty() && !valid_token(v)) {
                return Err(err());
            }
            let op = if neg { Op::NotIn(vals) } else { Op::In(vals) };
            return Ok((k.trim().into(), op));
        }
    }
    for (sep, ne) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = t.split_once(sep) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_token(k) || (!v.is_empty() && !valid_token(v)) {
                return Err(err());
            }
            let op = if ne { Op::NotEq(v.into()) } else { Op::Eq(v.into()) };
            return Ok((k.into(), op));
        }
    }
    if valid_token(t) { Ok((t.into(), Op::Exists)) } else { Err(err()) }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for t in s.split(',') {
            let t = t.trim();
            if t.is_empty() {
                continue;
            }
            let (k, ne, v) = if let Some((k, v)) = t.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = t.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = t.split_once('=') {
                (k, false, v)
            } else {
                return Err(SelectorError(format!("invalid selector: '{s}'; can't understand '{t}'")));
            };
            terms.push((k.trim().to_owned(), ne, v.trim().to_owned()));
        }
        Ok(FieldSelector { terms })
    }
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms.iter().find(|(k, ne, _)| k == field && !ne).map(|(_, _, v)| v.as_str())
    }
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|(k, _, _)| k.as_str())
    }
    pub fn matches(&self, value_of: &dyn Fn(&str) -> Option<String>) -> bool {
        self.terms.iter().all(|(k, ne, v)| (value_of(k).unwrap_or_default() == *v) != *ne)
    }
}
