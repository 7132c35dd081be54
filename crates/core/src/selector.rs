//! Label and field selectors, parsed and matched exactly as `k8s.io/apimachinery` does.
//!
//! [`LabelSelector`] follows `labels.Parse` (a small lexer with a context-sensitive `in`/`notin`
//! keyword, key and value validation, requirements sorted by key); [`FieldSelector`] follows
//! `fields.ParseSelector` (split on unescaped commas, first operator wins, backslash escapes,
//! no whitespace trimming). Error messages are worded like apimachinery's so that a 400 from the
//! proxy or the fake apiserver reads the same as one from kube-apiserver.

use std::fmt;

use serde_json::{Map, Value};

/// A selector that kube-apiserver would reject; the message is apimachinery's wording.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("{0}")]
pub struct SelectorError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, SelectorError> {
    Err(SelectorError(msg.into()))
}

// ---------------------------------------------------------------------------------------------
// Validation (k8s.io/apimachinery/pkg/util/validation)
// ---------------------------------------------------------------------------------------------

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', \
                                  and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric \
                               characters, '-', '_' or '.', and must start and end with an \
                               alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
                                     alphanumeric characters, '-' or '.', and must start and end \
                                     with an alphanumeric character";

/// apimachinery's `RegexError`, including its odd `', ` separators, so messages match verbatim.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{fmt}')",
        examples.join(" or ")
    )
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, without a regex engine.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_label_like(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
}

fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !s.split('.').all(is_dns1123_label_like) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `validation.IsQualifiedName`: an optional DNS-subdomain prefix, `/`, and a 63-char name.
fn qualified_name_errors(value: &str) -> Vec<String> {
    let parts: Vec<&str> = value.split('/').collect();
    let mut errs = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                let msgs = dns1123_subdomain_errors(prefix);
                errs.extend(msgs.into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' \
                 (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// `validation.IsValidLabelValue`: empty, or a qualified-name-like string of at most 63 bytes.
fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `field.Invalid(path, value, detail).Error()`.
fn invalid(path: &str, value: &str, detail: &[String]) -> String {
    format!("{path}: Invalid value: {value:?}: {}", detail.join("; "))
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let errs = qualified_name_errors(key);
    if errs.is_empty() {
        Ok(())
    } else {
        // The parser validates keys with an empty field path, hence the leading ": ".
        err(invalid("", key, &errs))
    }
}

// ---------------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------------

/// A label requirement operator (`selection.Operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One `key op values` term. Values are a sorted set, as apimachinery stores them.
#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// `labels.NewRequirement`: checks the value count per operator and every value.
    fn new(key: String, op: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        validate_key(&key)?;
        let mut errs = Vec::new();
        let count_ok = match op {
            Operator::In | Operator::NotIn => !values.is_empty(),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => values.len() == 1,
            Operator::Exists | Operator::DoesNotExist => values.is_empty(),
            Operator::GreaterThan | Operator::LessThan => values.len() == 1,
        };
        if !count_ok {
            errs.push(format!(
                "values: Invalid value: {values:?}: {}",
                count_detail(op)
            ));
        }
        if matches!(op, Operator::GreaterThan | Operator::LessThan) {
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(invalid(
                        &format!("values[{i}]"),
                        v,
                        &["for 'Gt', 'Lt' operators, the value must be an integer".to_owned()],
                    ));
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            let value_errs = label_value_errors(v);
            if !value_errs.is_empty() {
                errs.push(invalid(&format!("values[{i}][{key}]"), v, &value_errs));
            }
        }
        match errs.len() {
            0 => Ok(Requirement { key, op, values }),
            1 => err(errs.remove(0)),
            _ => err(format!("[{}]", errs.join(", "))),
        }
    }

    fn matches(&self, labels: &dyn Fn(&str) -> Option<String>) -> bool {
        let value = labels(&self.key);
        let has = |v: &String| self.values.iter().any(|x| x == v);
        match self.op {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                value.is_some_and(|v| has(&v))
            }
            Operator::NotIn | Operator::NotEquals => !value.is_some_and(|v| has(&v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => self.compare_int(value),
        }
    }

    /// Gt/Lt: a missing or non-integer label never matches.
    fn compare_int(&self, value: Option<String>) -> bool {
        let Some(actual) = value.and_then(|v| v.parse::<i64>().ok()) else {
            return false;
        };
        let Some(wanted) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
            return false;
        };
        match self.op {
            Operator::GreaterThan => actual > wanted,
            _ => actual < wanted,
        }
    }
}

fn count_detail(op: Operator) -> &'static str {
    match op {
        Operator::In | Operator::NotIn => "for 'in', 'notin' operators, values set can't be empty",
        Operator::Exists | Operator::DoesNotExist => {
            "values set must be empty for exists and does not exist"
        }
        Operator::GreaterThan | Operator::LessThan => {
            "for 'Gt', 'Lt' operators, exactly one value is required"
        }
        _ => "exact-match compatibility requires one single value",
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.op {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in (",
            Operator::NotIn => " notin (",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        f.write_str(op)?;
        f.write_str(&self.values.join(","))?;
        if matches!(self.op, Operator::In | Operator::NotIn) {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `k8s.io/apimachinery/pkg/labels` syntax, e.g. `app=web,tier in (a,b),!legacy`.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Parser::new(s).parse()?;
        // apimachinery sorts by key so that String() is deterministic.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether labels (looked up by key; `None` = no such label) satisfy every requirement.
    pub fn matches(&self, labels: &dyn Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Matches against an object's `metadata.labels` (absent = no labels).
    pub fn matches_json(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.matches(&|key| {
            labels
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    End,
    Identifier,
    In,
    NotIn,
    Comma,
    OpenPar,
    ClosedPar,
    DoesNotExist,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
}

/// In `Values` context `in`/`notin` are plain identifiers (`x in (in)` is valid).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn symbol_token(s: &str) -> Option<Token> {
    Some(match s {
        ")" => Token::ClosedPar,
        "," => Token::Comma,
        "!" => Token::DoesNotExist,
        "==" => Token::DoubleEquals,
        "=" => Token::Equals,
        ">" => Token::GreaterThan,
        "<" => Token::LessThan,
        "!=" => Token::NotEquals,
        "(" => Token::OpenPar,
        _ => return None,
    })
}

/// apimachinery's byte-wise lexer. A NUL byte ends the input, as Go's `read()` returns 0 there.
struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn peek(&self) -> u8 {
        self.s.as_bytes().get(self.pos).copied().unwrap_or(0)
    }

    fn next_token(&mut self) -> (Token, &'a str) {
        while is_space(self.peek()) {
            self.pos += 1;
        }
        match self.peek() {
            0 => (Token::End, ""),
            b if is_special(b) => self.scan_symbol(),
            _ => self.scan_identifier(),
        }
    }

    /// Longest run of special characters that still forms a known operator.
    fn scan_symbol(&mut self) -> (Token, &'a str) {
        let start = self.pos;
        let mut best = None;
        while is_special(self.peek()) {
            match symbol_token(&self.s[start..=self.pos]) {
                Some(tok) => best = Some((tok, self.pos + 1)),
                None if best.is_some() => break,
                None => {}
            }
            self.pos += 1;
        }
        // Every single special character is a token, so `best` is always set.
        let (tok, end) = best.unwrap_or((Token::End, self.pos));
        self.pos = end;
        (tok, &self.s[start..end])
    }

    fn scan_identifier(&mut self) -> (Token, &'a str) {
        let start = self.pos;
        while !matches!(self.peek(), 0) && !is_special(self.peek()) && !is_space(self.peek()) {
            self.pos += 1;
        }
        let lit = &self.s[start..self.pos];
        let tok = match lit {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier,
        };
        (tok, lit)
    }
}

/// The recursive-descent parser of `labels.Parse`, over a pre-scanned token list.
struct Parser<'a> {
    items: Vec<(Token, &'a str)>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(s: &'a str) -> Self {
        let mut lexer = Lexer { s, pos: 0 };
        let mut items = Vec::new();
        loop {
            let item = lexer.next_token();
            items.push(item);
            if item.0 == Token::End {
                break;
            }
        }
        Parser { items, pos: 0 }
    }

    fn lookahead(&self, ctx: Context) -> (Token, &'a str) {
        // The list always ends with End and parsing stops there, so pos stays in range.
        let (tok, lit) = self.items[self.pos.min(self.items.len() - 1)];
        match (ctx, tok) {
            (Context::Values, Token::In | Token::NotIn) => (Token::Identifier, lit),
            _ => (tok, lit),
        }
    }

    fn consume(&mut self, ctx: Context) -> (Token, &'a str) {
        let item = self.lookahead(ctx);
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self.parse_requirement().map_err(|e| {
                        SelectorError(format!("unable to parse requirement: {}", e.0))
                    })?;
                    requirements.push(r);
                    match self.consume(Context::Values) {
                        (Token::End, _) => return Ok(requirements),
                        (Token::Comma, _) => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if !matches!(t2, Token::Identifier | Token::DoesNotExist) {
                                return err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        (_, l) => {
                            return err(format!("found '{l}', expected: ',' or 'end of string'"));
                        }
                    }
                }
                Token::End => return Ok(requirements),
                _ => {
                    return err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        if let Some(op) = op {
            return Requirement::new(key.to_owned(), op, Vec::new());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        Requirement::new(key.to_owned(), op, values)
    }

    /// Returns the key, and the operator when it is unary (`key` = exists, `!key`).
    fn parse_key_and_infer_operator(
        &mut self,
    ) -> Result<(&'a str, Option<Operator>), SelectorError> {
        let (mut tok, mut lit) = self.consume(Context::Values);
        let negated = tok == Token::DoesNotExist;
        if negated {
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return err(format!("found '{lit}', expected: identifier"));
        }
        validate_key(lit)?;
        let at_end = matches!(self.lookahead(Context::Values).0, Token::End | Token::Comma);
        let op = match (negated, at_end) {
            (true, _) => Some(Operator::DoesNotExist),
            (false, true) => Some(Operator::Exists),
            (false, false) => None,
        };
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<Operator, SelectorError> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return err(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return err(format!("found '{lit}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// Comma-separated, possibly empty identifiers: `(a,,b)` and `(,)` contain `""`.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    set.insert(lit.to_owned());
                    match self.lookahead(Context::Values) {
                        (Token::Comma, _) => continue,
                        (Token::ClosedPar, _) => return Ok(set.into_iter().collect()),
                        (_, l2) => return err(format!("found '{l2}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::ClosedPar => {
                            set.insert(String::new());
                            return Ok(set.into_iter().collect());
                        }
                        Token::Comma => {
                            self.consume(Context::Values);
                            set.insert(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        if matches!(self.lookahead(Context::Values).0, Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        match self.consume(Context::Values) {
            (Token::Identifier, lit) => Ok(vec![lit.to_owned()]),
            (_, lit) => err(format!("found '{lit}', expected: identifier")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------------

/// One `field=value` (`==` is the same) or `field!=value` term; `value` is unescaped.
#[derive(Debug, Clone, PartialEq)]
struct FieldTerm {
    field: String,
    negated: bool,
    value: String,
}

impl fmt::Display for FieldTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.negated { "!=" } else { "=" };
        write!(f, "{}{op}{}", self.field, escape_value(&self.value))
    }
}

/// A parsed `fieldSelector`; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses `fields.ParseSelector` syntax. Unlike label selectors, whitespace is significant.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for part in split_terms(s) {
            if part.is_empty() {
                continue;
            }
            let Some((field, negated, raw)) = split_term(part) else {
                return err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            terms.push(FieldTerm {
                field: field.to_owned(),
                negated,
                value: unescape_value(raw)?,
            });
        }
        // apimachinery sorts the raw terms; sorting the canonical form keeps that order while
        // making `parse(to_string())` an identity (`==` prints as `=`).
        terms.sort_by_cached_key(ToString::to_string);
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// `fields.Selector.RequiresExactMatch`: the value of the first `field=value` term.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| !t.negated && t.field == field)
            .map(|t| t.value.as_str())
    }

    /// The field names the selector refers to, in term order (possibly repeated).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|t| t.field.as_str())
    }

    /// A missing field reads as `""`, like apimachinery's `fields.Set.Get`.
    pub fn matches(&self, value_of: &dyn Fn(&str) -> Option<String>) -> bool {
        self.terms.iter().all(|t| {
            let actual = value_of(&t.field).unwrap_or_default();
            (actual == t.value) != t.negated
        })
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// Splits on commas not preceded by a backslash; the backslash stays in the term.
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let (mut start, mut in_slash) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if in_slash => in_slash = false,
            '\\' => in_slash = true,
            ',' => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms
}

/// The first operator occurrence splits the term; `!=` and `==` win over `=` at the same spot.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        [("!=", true), ("==", false), ("=", false)]
            .into_iter()
            .find(|(op, _)| rest.starts_with(op))
            .map(|(op, negated)| (&term[..i], negated, &rest[op.len()..]))
    })
}

fn unescape_value(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            if !matches!(c, '\\' | ',' | '=') {
                return err(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                ));
            }
            out.push(c);
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Go formats the rune with %v, i.e. as its code point number.
            ',' | '=' => {
                return err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                ));
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return err("invalid field selector: invalid escape sequence: \\");
    }
    Ok(out)
}

/// `fields.EscapeValue`: the inverse of [`unescape_value`].
fn escape_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel_matches(sel: &str, set: &HashMap<String, String>) -> bool {
        LabelSelector::parse(sel)
            .unwrap_or_else(|e| panic!("{sel:?}: {e}"))
            .matches(&|k| set.get(k).cloned())
    }

    #[test]
    fn empty_and_blank_selectors_match_everything() {
        for s in ["", "  ", "\t"] {
            let sel = LabelSelector::parse(s).unwrap();
            assert!(sel.is_empty());
            assert!(sel.matches(&|_| None));
        }
        assert!(!LabelSelector::parse("a").unwrap().is_empty());
    }

    #[test]
    fn equality_operators() {
        let set = labels(&[("app", "web"), ("tier", "")]);
        assert!(sel_matches("app=web", &set));
        assert!(sel_matches("app==web", &set));
        assert!(!sel_matches("app=db", &set));
        assert!(sel_matches("app!=db", &set));
        assert!(!sel_matches("app!=web", &set));
        // != matches when the key is missing, = does not.
        assert!(sel_matches("zone!=x", &set));
        assert!(!sel_matches("zone=x", &set));
        // An empty value is a value.
        assert!(sel_matches("tier=", &set));
        assert!(!sel_matches("zone=", &set));
    }

    #[test]
    fn set_operators() {
        let set = labels(&[("env", "prod")]);
        assert!(sel_matches("env in (dev, prod)", &set));
        assert!(!sel_matches("env in (dev)", &set));
        assert!(!sel_matches("other in (prod)", &set));
        assert!(sel_matches("env notin (dev)", &set));
        assert!(!sel_matches("env notin (prod,dev)", &set));
        assert!(sel_matches("other notin (prod)", &set));
    }

    #[test]
    fn existence_operators() {
        let set = labels(&[("a", "1")]);
        assert!(sel_matches("a", &set));
        assert!(!sel_matches("b", &set));
        assert!(sel_matches("!b", &set));
        assert!(!sel_matches("!a", &set));
        assert!(sel_matches(
            "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name",
            &set
        ));
    }

    #[test]
    fn integer_comparisons() {
        let set = labels(&[("n", "10"), ("s", "x")]);
        assert!(sel_matches("n>9", &set));
        assert!(!sel_matches("n>10", &set));
        assert!(sel_matches("n<11", &set));
        assert!(!sel_matches("n<10", &set));
        assert!(!sel_matches("s>1", &set), "non-integer labels never match");
        assert!(!sel_matches("m<100", &set), "missing labels never match");
        let e = LabelSelector::parse("n>x").unwrap_err();
        assert!(e.0.contains("the value must be an integer"), "{e}");
    }

    #[test]
    fn keywords_are_values_in_value_position() {
        let set = labels(&[("x", "in")]);
        assert!(sel_matches("x in (in,notin)", &set));
        assert!(sel_matches("x=in", &set));
        assert!(sel_matches("in", &labels(&[("in", "")])));
    }

    #[test]
    fn empty_set_members() {
        let sel = LabelSelector::parse("x in (a,,b)").unwrap();
        assert_eq!(sel.to_string(), "x in (,a,b)");
        assert_eq!(
            LabelSelector::parse("x in ()").unwrap().to_string(),
            "x in ()"
        );
        assert!(sel.matches(&|_| Some(String::new())));
    }

    #[test]
    fn requirements_are_sorted_and_printed_like_apimachinery() {
        let sel = LabelSelector::parse(" z!=1 , a in (c,b) ,!m,k, n>3").unwrap();
        assert_eq!(sel.to_string(), "a in (b,c),k,!m,n>3,z!=1");
    }

    #[test]
    fn syntax_errors_use_apimachinery_wording() {
        let cases = [
            ("a=b=c", "found '=', expected: ',' or 'end of string'"),
            ("a,", "found '', expected: identifier after ','"),
            (
                ",a",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
            (
                "a in b",
                "unable to parse requirement: found 'b' expected: '('",
            ),
            (
                "a in (b",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a!b",
                "unable to parse requirement: found '!', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a (b)",
                "unable to parse requirement: found '(', expected: in, notin",
            ),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
            (
                "!!a",
                "unable to parse requirement: found '!', expected: identifier",
            ),
        ];
        for (input, want) in cases {
            let got = LabelSelector::parse(input).unwrap_err().0;
            assert!(got.starts_with(want), "{input:?}: {got}");
        }
    }

    #[test]
    fn keys_and_values_are_validated() {
        let key_err = LabelSelector::parse("-a=b").unwrap_err().0;
        assert!(
            key_err.starts_with("unable to parse requirement: : Invalid value: \"-a\": name part"),
            "{key_err}"
        );
        let prefix_err = LabelSelector::parse("Example.com/a").unwrap_err().0;
        assert!(
            prefix_err.contains("prefix part a lowercase RFC 1123"),
            "{prefix_err}"
        );
        assert!(LabelSelector::parse("a/b/c").is_err());
        assert!(LabelSelector::parse(&format!("{}=x", "k".repeat(64))).is_err());
        assert!(LabelSelector::parse(&format!("k={}", "v".repeat(64))).is_err());
        let value_err = LabelSelector::parse("app=a_").unwrap_err().0;
        assert!(
            value_err
                .starts_with("unable to parse requirement: values[0][app]: Invalid value: \"a_\""),
            "{value_err}"
        );
        assert!(LabelSelector::parse("example.com/a-b_c.d=V.1_x-2").is_ok());
    }

    #[test]
    fn matches_json_reads_metadata_labels() {
        let obj = serde_json::json!({"app": "web", "n": 1});
        let sel = LabelSelector::parse("app=web").unwrap();
        assert!(sel.matches_json(obj.as_object()));
        assert!(!sel.matches_json(None));
        assert!(LabelSelector::parse("!app").unwrap().matches_json(None));
        assert!(
            !LabelSelector::parse("n")
                .unwrap()
                .matches_json(obj.as_object())
        );
    }

    fn fields_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |f| {
            pairs
                .iter()
                .find(|(k, _)| *k == f)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn field_selector_terms_and_matching() {
        let sel = FieldSelector::parse("spec.nodeName=edge-1,status.phase!=Failed").unwrap();
        let set = [("spec.nodeName", "edge-1"), ("status.phase", "Running")];
        assert!(sel.matches(&fields_of(&set)));
        let set = [("spec.nodeName", "edge-1"), ("status.phase", "Failed")];
        assert!(!sel.matches(&fields_of(&set)));
        assert_eq!(sel.requires_exact_match("spec.nodeName"), Some("edge-1"));
        assert_eq!(sel.requires_exact_match("status.phase"), None);
        let mut fields: Vec<_> = sel.fields().collect();
        fields.sort();
        assert_eq!(fields, ["spec.nodeName", "status.phase"]);
    }

    #[test]
    fn field_selector_missing_field_is_empty_string() {
        assert!(FieldSelector::parse("a=").unwrap().matches(&|_| None));
        assert!(!FieldSelector::parse("a=x").unwrap().matches(&|_| None));
        assert!(FieldSelector::parse("a!=x").unwrap().matches(&|_| None));
        assert!(FieldSelector::parse("").unwrap().is_empty());
        assert!(FieldSelector::parse(",").unwrap().is_empty());
    }

    #[test]
    fn field_selector_double_equals_and_escapes() {
        let sel = FieldSelector::parse(r"metadata.name==a\,b\=c\\d").unwrap();
        assert_eq!(sel.requires_exact_match("metadata.name"), Some(r"a,b=c\d"));
        assert_eq!(sel.to_string(), r"metadata.name=a\,b\=c\\d");
    }

    #[test]
    fn field_selector_keeps_whitespace_like_apimachinery() {
        let sel = FieldSelector::parse("a = b").unwrap();
        assert_eq!(sel.fields().collect::<Vec<_>>(), ["a "]);
        assert_eq!(sel.requires_exact_match("a "), Some(" b"));
    }

    #[test]
    fn field_selector_errors() {
        let e = FieldSelector::parse("abc").unwrap_err().0;
        assert_eq!(e, "invalid selector: 'abc'; can't understand 'abc'");
        let e = FieldSelector::parse(r"a=b\x").unwrap_err().0;
        assert_eq!(e, r"invalid field selector: invalid escape sequence: \x");
        let e = FieldSelector::parse(r"a=b\").unwrap_err().0;
        assert_eq!(e, r"invalid field selector: invalid escape sequence: \");
        let e = FieldSelector::parse("a=b=c").unwrap_err().0;
        assert_eq!(
            e,
            "invalid field selector: unescaped character in value: 61"
        );
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9]([a-z0-9._-]{0,8}[a-z0-9])?",
            "[a-z]{1,5}(\\.[a-z]{1,4})?/[A-Za-z0-9]([A-Za-z0-9_.-]{0,6}[A-Za-z0-9])?",
        ]
    }

    fn value_strategy() -> impl Strategy<Value = String> {
        "([A-Za-z0-9]([A-Za-z0-9_.-]{0,6}[A-Za-z0-9])?)?"
    }

    /// Sorted and deduplicated, so at most one leading `""`: apimachinery itself rejects some
    /// runs of empty members such as `(a,,)`.
    fn value_set_strategy() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set(value_strategy(), 1..4).prop_map(|s| s.into_iter().collect())
    }

    fn requirement_strategy() -> impl Strategy<Value = String> {
        let values = value_set_strategy();
        (key_strategy(), 0..9usize, values, any::<i32>()).prop_map(|(k, op, vs, n)| match op {
            0 => format!("{k}={}", vs[0]),
            1 => format!("{k}=={}", vs[0]),
            2 => format!("{k}!={}", vs[0]),
            3 => format!("{k} in ({})", vs.join(",")),
            4 => format!("{k} notin ({})", vs.join(",")),
            5 => k,
            6 => format!("!{k}"),
            7 => format!("{k}>{}", n.unsigned_abs()),
            _ => format!("{k}<{}", n.unsigned_abs()),
        })
    }

    /// A direct model of one requirement's semantics, independent of the parser.
    fn model_matches(op: usize, values: &[String], n: u32, actual: Option<&String>) -> bool {
        let int = actual.and_then(|v| v.parse::<i64>().ok());
        match op {
            0 | 1 => actual == Some(&values[0]),
            2 => actual != Some(&values[0]),
            3 => actual.is_some_and(|a| values.contains(a)),
            4 => !actual.is_some_and(|a| values.contains(a)),
            5 => actual.is_some(),
            6 => actual.is_none(),
            7 => int.is_some_and(|i| i > i64::from(n)),
            _ => int.is_some_and(|i| i < i64::from(n)),
        }
    }

    proptest! {
        #[test]
        fn label_parser_never_panics(s in "\\PC{0,40}") {
            let _ = LabelSelector::parse(&s);
        }

        #[test]
        fn label_parser_never_panics_on_selector_alphabet(s in "[a-c !=(),<>0-9in\t]{0,30}") {
            if let Ok(sel) = LabelSelector::parse(&s) {
                let again = LabelSelector::parse(&sel.to_string());
                prop_assert_eq!(again, Ok(sel));
            }
        }

        #[test]
        fn label_selector_round_trips(reqs in prop::collection::vec(requirement_strategy(), 0..5)) {
            let sel = LabelSelector::parse(&reqs.join(",")).unwrap();
            let printed = sel.to_string();
            prop_assert_eq!(LabelSelector::parse(&printed), Ok(sel));
        }

        #[test]
        fn label_requirement_semantics(
            key in key_strategy(),
            op in 0..9usize,
            values in value_set_strategy(),
            n in 0..50u32,
            actual in prop::option::of(prop_oneof![value_strategy(), (0..100u32).prop_map(|i| i.to_string())]),
        ) {
            let text = match op {
                0 => format!("{key}={}", values[0]),
                1 => format!("{key}=={}", values[0]),
                2 => format!("{key}!={}", values[0]),
                3 => format!("{key} in ({})", values.join(",")),
                4 => format!("{key} notin ({})", values.join(",")),
                5 => key.clone(),
                6 => format!("!{key}"),
                7 => format!("{key}>{n}"),
                _ => format!("{key}<{n}"),
            };
            let sel = LabelSelector::parse(&text).unwrap();
            let got = sel.matches(&|k| if k == key { actual.clone() } else { None });
            prop_assert_eq!(got, model_matches(op, &values, n, actual.as_ref()));
        }

        #[test]
        fn field_parser_never_panics(s in "\\PC{0,40}") {
            let _ = FieldSelector::parse(&s);
        }

        #[test]
        fn field_selector_round_trips(
            terms in prop::collection::vec(("[a-z.]{1,8}", any::<bool>(), "[a-z,=\\\\ -]{0,6}"), 0..4)
        ) {
            let text: Vec<String> = terms
                .iter()
                .map(|(f, neg, v)| format!("{f}{}{}", if *neg { "!=" } else { "=" }, escape_value(v)))
                .collect();
            let sel = FieldSelector::parse(&text.join(",")).unwrap();
            for (f, neg, v) in &terms {
                let others_ok = terms.iter().all(|(f2, n2, v2)| f2 != f || (n2 == neg && v2 == v));
                if !neg && others_ok {
                    prop_assert_eq!(sel.requires_exact_match(f), Some(v.as_str()));
                }
            }
            prop_assert_eq!(FieldSelector::parse(&sel.to_string()), Ok(sel));
        }
    }
}
