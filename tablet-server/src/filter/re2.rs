//! RE2 regexes in Latin-1 mode, translated into the `regex` crate's syntax (RE2's rejections
//! included) and compiled as full matches.

use std::fmt::Write as _;

use regex::bytes::{Regex, RegexBuilder};

use super::FilterError;

/// RE2's largest counted repetition (`a{1000}`).
const MAX_REPEAT: u32 = 1000;

/// Compiles an RE2 (Latin-1) pattern for a full match against raw bytes.
pub(super) fn compile_regex(field: &'static str, pattern: &[u8]) -> Result<Regex, FilterError> {
    let invalid = |reason: String| FilterError::InvalidRegex {
        field,
        pattern: String::from_utf8_lossy(pattern).into_owned(),
        reason,
    };
    let translated = translate_re2(pattern).map_err(invalid)?;
    RegexBuilder::new(&format!(r"\A(?:{translated})\z"))
        .unicode(false)
        .build()
        .map_err(|e| {
            // The `regex` crate's message quotes the translated pattern; keep only the cause.
            let msg = e.to_string();
            let reason = msg
                .lines()
                .find_map(|l| l.trim().strip_prefix("error: "))
                .unwrap_or(msg.lines().last().unwrap_or("invalid regular expression"))
                .to_string();
            invalid(reason)
        })
}

/// A set of bytes, for character classes.
#[derive(Clone, Copy)]
struct ByteSet([u64; 4]);

impl ByteSet {
    pub(super) fn new() -> ByteSet {
        ByteSet([0; 4])
    }

    pub(super) fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] & (1 << (b & 63)) != 0
    }

    fn insert(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1 << (b & 63);
    }

    fn add_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.insert(b);
        }
    }

    fn add_where(&mut self, mut pred: impl FnMut(u8) -> bool) {
        for b in 0..=255u8 {
            if pred(b) {
                self.insert(b);
            }
        }
    }

    fn union(&mut self, other: &ByteSet) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }

    pub(super) fn negate(&mut self) {
        for word in &mut self.0 {
            *word = !*word;
        }
    }

    /// Adds the case counterpart of every letter in the set.
    pub(super) fn fold(&mut self) {
        let before = *self;
        for b in 0..=255u8 {
            if before.contains(b)
                && let Some(other) = latin1_case_counterpart(b)
            {
                self.insert(other);
            }
        }
    }

    /// RE2's order for a class under `(?i)`: fold the positive set, then negate it.
    fn finish(mut self, negated: bool, fold: bool) -> ByteSet {
        if fold {
            self.fold();
        }
        if negated {
            self.negate();
        }
        self
    }

    /// Emits the set as one `regex` atom matching exactly one byte of the set. Under `(?i)`
    /// (`fold`) the set is already folded and must not be folded again by `regex`.
    pub(super) fn emit(&self, out: &mut String, fold: bool) {
        if self.0.iter().all(|w| *w == u64::MAX) {
            out.push_str("(?s:.)");
            return;
        }
        if self.0.iter().all(|w| *w == 0) {
            out.push_str(NEVER);
            return;
        }
        out.push_str(if fold { "(?-i:[" } else { "[" });
        let mut b = 0u16;
        while b < 256 {
            if !self.contains(b as u8) {
                b += 1;
                continue;
            }
            let lo = b;
            while b < 255 && self.contains((b + 1) as u8) {
                b += 1;
            }
            let _ = write!(out, "\\x{lo:02X}");
            if b > lo {
                let _ = write!(out, "-\\x{b:02X}");
            }
            b += 1;
        }
        out.push_str(if fold { "])" } else { "]" });
    }
}

/// An atom that never matches (a byte followed by the start of the text).
const NEVER: &str = r"(?:\x00\A)";

/// The other case of a Latin-1 letter under Unicode simple case folding, when it is Latin-1
/// too (`µ`, `ß` and `ÿ` fold only to code points above 0xFF).
fn latin1_case_counterpart(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' | 0xC0..=0xDE if b != 0xD7 => Some(b + 0x20),
        b'a'..=b'z' | 0xE0..=0xFE if b != 0xF7 => Some(b - 0x20),
        _ => None,
    }
}

/// The characters equal to Latin-1 character `b` under Unicode simple case folding.
fn case_orbit(b: u8) -> Vec<char> {
    let mut orbit = vec![char::from(b)];
    orbit.extend(latin1_case_counterpart(b).map(char::from));
    orbit.extend(match b {
        b'K' | b'k' => &['\u{212A}'][..],
        b'S' | b's' => &['\u{17F}'],
        0xB5 => &['\u{39C}', '\u{3BC}'],
        0xC5 | 0xE5 => &['\u{212B}'],
        0xDF => &['\u{1E9E}'],
        0xFF => &['\u{178}'],
        _ => &[],
    });
    orbit
}

/// RE2's `\s` (note: unlike `regex`, without `\v`).
fn is_re2_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0C | b'\r' | b' ')
}

/// The positive set of a Perl class escape letter (`d`, `D`, `s`, `S`, `w`, `W`) and whether
/// the escape negates it.
fn perl_class(letter: u8) -> Option<(ByteSet, bool)> {
    let mut set = ByteSet::new();
    match letter.to_ascii_lowercase() {
        b'd' => set.add_where(|b| b.is_ascii_digit()),
        b's' => set.add_where(is_re2_space),
        b'w' => set.add_where(|b| b.is_ascii_alphanumeric() || b == b'_'),
        _ => return None,
    }
    Some((set, letter.is_ascii_uppercase()))
}

/// The positive set of a POSIX class name such as `alpha` or `^digit` (from `[[:alpha:]]`) and
/// whether it is negated.
fn posix_class(name: &[u8]) -> Option<(ByteSet, bool)> {
    let (negated, name) = match name.strip_prefix(b"^") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    let pred: fn(u8) -> bool = match name {
        b"alnum" => |b| b.is_ascii_alphanumeric(),
        b"alpha" => |b| b.is_ascii_alphabetic(),
        b"ascii" => |b| b.is_ascii(),
        b"blank" => |b| b == b' ' || b == b'\t',
        b"cntrl" => |b| b < 0x20 || b == 0x7F,
        b"digit" => |b| b.is_ascii_digit(),
        b"graph" => |b| b.is_ascii_graphic(),
        b"lower" => |b| b.is_ascii_lowercase(),
        b"print" => |b| b.is_ascii_graphic() || b == b' ',
        b"punct" => |b| b.is_ascii_punctuation(),
        b"space" => |b| matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' '),
        b"upper" => |b| b.is_ascii_uppercase(),
        b"word" => |b| b.is_ascii_alphanumeric() || b == b'_',
        b"xdigit" => |b| b.is_ascii_hexdigit(),
        _ => return None,
    };
    let mut set = ByteSet::new();
    set.add_where(pred);
    Some((set, negated))
}

/// The Unicode general categories RE2 accepts in `\pX` / `\p{Name}`.
const RE2_CATEGORIES: [&str; 36] = [
    "C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn", "N",
    "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So",
    "Z", "Zl", "Zp", "Zs",
];

/// The positive Latin-1 set of a Unicode class escape `\pX`, `\p{Name}`, `\PX`, `\p{^Name}`
/// starting at `p[i]` (the backslash), whether it is negated, and the index after it. Under
/// `(?i)` (`fold`) the set is case-folded over all of Unicode, as RE2 does before negating: `ÿ`
/// is in `(?i)\p{Lu}` because `Ÿ` (U+0178) is.
fn unicode_class(p: &[u8], i: usize, fold: bool) -> Result<(ByteSet, bool, usize), String> {
    let mut negated = p[i + 1] == b'P';
    let (mut name, next) = match p.get(i + 2) {
        None => return Err("invalid character class: missing name after \\p".into()),
        Some(b'{') => {
            let close = p[i + 3..]
                .iter()
                .position(|&b| b == b'}')
                .ok_or("invalid character class: missing '}' after \\p{")?;
            (&p[i + 3..i + 3 + close], i + 4 + close)
        }
        Some(_) => (&p[i + 2..i + 3], i + 3),
    };
    if let Some(rest) = name.strip_prefix(b"^") {
        negated = !negated;
        name = rest;
    }
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphabetic() || *b == b'_') {
        return Err(format!(
            "invalid character class range: \\p{{{}}}",
            String::from_utf8_lossy(name)
        ));
    }
    let name = std::str::from_utf8(name).map_err(|e| e.to_string())?;
    let unknown = || format!("invalid character class range: \\p{{{name}}}");
    // RE2 knows "Any", the general categories and the scripts, all spelled exactly; `regex`
    // matches names loosely, so only ask it about names RE2 could accept.
    let property = if name == "Any" {
        "Any".to_string()
    } else if RE2_CATEGORIES.contains(&name) {
        format!("gc={name}")
    } else if name.starts_with(|c: char| c.is_ascii_uppercase()) {
        format!("sc={name}")
    } else {
        return Err(unknown());
    };
    thread_local! {
        /// Latin-1 sets of the classes seen so far (only valid names get in: it stays small).
        static CACHE: std::cell::RefCell<std::collections::HashMap<(String, bool), ByteSet>> =
            Default::default();
    }
    let key = (property, fold);
    if let Some(set) = CACHE.with(|c| c.borrow().get(&key).copied()) {
        return Ok((set, negated, next));
    }
    // Evaluate the Unicode class on the 256 Latin-1 code points.
    let class = regex::Regex::new(&format!(r"\A\p{{{}}}\z", key.0)).map_err(|_| unknown())?;
    let mut set = ByteSet::new();
    let mut buf = [0u8; 4];
    set.add_where(|b| {
        let orbit = if fold {
            case_orbit(b)
        } else {
            vec![char::from(b)]
        };
        orbit
            .into_iter()
            .any(|c| class.is_match(c.encode_utf8(&mut buf)))
    });
    CACHE.with(|c| c.borrow_mut().insert(key, set));
    Ok((set, negated, next))
}

fn is_octal(b: &u8) -> bool {
    (b'0'..=b'7').contains(b)
}

/// Parses an escape denoting one character, starting at `p[i]` (the backslash); returns the
/// character and the index after the escape. In Latin-1 mode RE2 rejects code points above
/// 0xFF (`\x{100}`, `\400`).
fn literal_escape(p: &[u8], i: usize) -> Result<(u8, usize), String> {
    let (v, next) = escaped_code_point(p, i)?;
    match u8::try_from(v) {
        Ok(b) => Ok((b, next)),
        Err(_) => Err(format!(
            "invalid escape sequence: {} (not a Latin-1 character)",
            String::from_utf8_lossy(&p[i..next])
        )),
    }
}

fn escaped_code_point(p: &[u8], i: usize) -> Result<(u32, usize), String> {
    let Some(&c) = p.get(i + 1) else {
        return Err("trailing \\ at end of regular expression".into());
    };
    let simple = |v: u8| Ok((u32::from(v), i + 2));
    match c {
        b'a' => simple(0x07),
        b'f' => simple(0x0C),
        b't' => simple(b'\t'),
        b'n' => simple(b'\n'),
        b'r' => simple(b'\r'),
        b'v' => simple(0x0B),
        // Octal: \0 followed by up to two digits, or \1-\7 followed by one or two digits
        // (a lone \1-\7 would be a backreference, which RE2 does not support).
        b'0'..=b'7' => {
            if c != b'0' && !p.get(i + 2).is_some_and(is_octal) {
                return Err(format!(
                    "invalid escape sequence: \\{} (backreferences are not supported)",
                    c as char
                ));
            }
            let mut j = i + 2;
            let mut v = u32::from(c - b'0');
            while j < i + 4 && p.get(j).is_some_and(is_octal) {
                v = v * 8 + u32::from(p[j] - b'0');
                j += 1;
            }
            Ok((v, j))
        }
        b'x' => {
            let hex = |b: &u8| (*b as char).to_digit(16);
            if p.get(i + 2) == Some(&b'{') {
                let close = p[i + 3..]
                    .iter()
                    .position(|&b| b == b'}')
                    .ok_or("invalid escape sequence: missing '}' after \\x{")?;
                let digits = &p[i + 3..i + 3 + close];
                let mut v: u32 = 0;
                if digits.is_empty() {
                    return Err("invalid escape sequence: empty \\x{}".into());
                }
                for d in digits {
                    let d = hex(d).ok_or("invalid escape sequence: bad hex digit in \\x{}")?;
                    v = v.saturating_mul(16).saturating_add(d);
                }
                if v > 0x10FFFF {
                    return Err("invalid escape sequence: \\x{} code point too large".into());
                }
                Ok((v, i + 4 + close))
            } else {
                match (p.get(i + 2).and_then(hex), p.get(i + 3).and_then(hex)) {
                    (Some(h), Some(l)) => Ok((h * 16 + l, i + 4)),
                    _ => Err("invalid escape sequence: \\x needs two hex digits".into()),
                }
            }
        }
        // Escaped punctuation (and other non-word ASCII) stands for itself.
        _ if c.is_ascii() && !c.is_ascii_alphanumeric() => simple(c),
        _ => Err(format!(
            "invalid escape sequence: \\{}",
            String::from_utf8_lossy(&p[i + 1..i + 2])
        )),
    }
}

/// Emits a literal byte. Under `(?i)` (`fold`), `regex` folds ASCII letters itself; non-ASCII
/// Latin-1 letters are paired here.
fn push_literal(out: &mut String, b: u8, fold: bool) {
    if b.is_ascii_alphanumeric() {
        out.push(b as char);
    } else if fold && !b.is_ascii() && latin1_case_counterpart(b).is_some() {
        let mut set = ByteSet::new();
        set.insert(b);
        set.finish(false, true).emit(out, true);
    } else {
        let _ = write!(out, "\\x{b:02X}");
    }
}

/// Parses a counted repetition `{n}`, `{n,}` or `{n,m}` at the start of `p`; returns
/// `(n, m, has_comma, length)`. Anything else is not a repetition (RE2 then reads `{` as a
/// literal).
fn counted_repeat(p: &[u8]) -> Option<(u32, Option<u32>, bool, usize)> {
    let close = p.iter().position(|&b| b == b'}')?;
    let body = &p[1..close];
    let number = |s: &[u8]| -> Option<u32> {
        if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Saturate: anything this large is rejected as too big anyway.
        Some(s.iter().fold(0u32, |v, d| {
            v.saturating_mul(10).saturating_add(u32::from(d - b'0'))
        }))
    };
    match body.iter().position(|&b| b == b',') {
        None => Some((number(body)?, None, false, close + 1)),
        Some(comma) => {
            let min = number(&body[..comma])?;
            let rest = &body[comma + 1..];
            if rest.is_empty() {
                Some((min, None, true, close + 1))
            } else {
                Some((min, Some(number(rest)?), true, close + 1))
            }
        }
    }
}

/// Translation state: the output, the `(?i)` state and the groups it is saved in.
struct Translation {
    out: String,
    /// Whether `(?i)` is in effect.
    pub(super) fold: bool,
    /// For each open group: `fold` outside it and where it starts in `out`.
    groups: Vec<(bool, usize)>,
    /// Flag-only groups like `(?i)` not yet emitted. RE2 lets a repetition operator after one
    /// apply to the atom before it (`a(?i)*` is `a*` with `i` set), so they are emitted just
    /// before the next token that is not a repetition.
    pending_flags: String,
}

impl Translation {
    fn flush_flags(&mut self) {
        self.out.push_str(&self.pending_flags);
        self.pending_flags.clear();
    }
}

/// Translates an RE2 pattern (Latin-1 mode, Perl-like syntax as Bigtable configures it) into
/// the `regex` crate's syntax for a bytes regex with Unicode disabled.
///
/// Every literal byte and every class is emitted as `\xHH` escapes, so `regex`-only syntax
/// (nested classes, `&&`, `\<`, ...) can never be introduced by the input. RE2 constructs with
/// a different meaning in `regex` are rewritten: `\C` (any byte), `\Q...\E`, octal escapes,
/// `\s` (no `\v` in RE2), `[` and `{` as literals, Latin-1 `\pN` classes, case folding of
/// negated classes and of Latin-1 letters under `(?i)`, repetitions after flag groups.
/// Constructs RE2 rejects (stacked repetitions, `a{1001}`, lookaround, backreferences,
/// unbalanced parentheses, flags other than `imsU`) are rejected. The translation was checked
/// against libre2 (Latin-1, full match) on about a million random patterns.
pub(super) fn translate_re2(p: &[u8]) -> Result<String, String> {
    let mut t = Translation {
        out: String::with_capacity(p.len() * 4 + 8),
        fold: false,
        groups: Vec::new(),
        pending_flags: String::new(),
    };
    let mut i = 0usize;
    // Where the last atom (what a repetition would apply to) starts in `t.out`.
    let mut atom: Option<usize> = None;
    // Whether the last token was a repetition, and whether flag groups came after it.
    let mut after_repeat = false;
    let mut flags_since_repeat = false;
    // RE2 caps the product of nested counted repetitions (`(a{10}){200}`) at 1000: the largest
    // product inside the last atom, inside the current group, and inside each enclosing group.
    let mut atom_product: u64 = 1;
    let mut group_product: u64 = 1;
    let mut enclosing_products: Vec<u64> = Vec::new();
    while i < p.len() {
        let c = p[i];
        let repeat = match c {
            b'*' | b'+' | b'?' => Some(((c as char).to_string(), 1, 1)),
            b'{' => match counted_repeat(&p[i..]) {
                Some((min, max, comma, len)) => {
                    if min > MAX_REPEAT || max.is_some_and(|m| m > MAX_REPEAT || m < min) {
                        return Err(format!(
                            "bad repetition operator: {}",
                            String::from_utf8_lossy(&p[i..i + len])
                        ));
                    }
                    let op = match (comma, max) {
                        (false, _) => format!("{{{min}}}"),
                        (true, None) => format!("{{{min},}}"),
                        (true, Some(max)) => format!("{{{min},{max}}}"),
                    };
                    Some((op, len, u64::from(max.unwrap_or(min))))
                }
                None => None,
            },
            _ => None,
        };
        if let Some((op, len, count)) = repeat {
            let Some(start) = atom else {
                return Err(format!("missing argument to repetition operator: {op}"));
            };
            if after_repeat {
                if !flags_since_repeat {
                    return Err(format!("bad repetition operator: {op}"));
                }
                // `a*(?i)+`: RE2 repeats the repetition; `regex` needs a group for that.
                t.out.insert_str(start, "(?:");
                t.out.push(')');
            }
            if count > 0 {
                atom_product = atom_product.saturating_mul(count);
                if atom_product > u64::from(MAX_REPEAT) {
                    return Err(format!("invalid repetition size: {op}"));
                }
                group_product = group_product.max(atom_product);
            }
            t.out.push_str(&op);
            i += len;
            if p.get(i) == Some(&b'?') {
                t.out.push('?');
                i += 1;
            }
            after_repeat = true;
            flags_since_repeat = false;
            continue;
        }
        if c == b'(' && translate_flag_group(p, &mut i, &mut t)? {
            flags_since_repeat = true;
            continue;
        }
        // An empty quote `\Q\E` is just as transparent.
        if p[i..].starts_with(b"\\Q") && (p[i + 2..].starts_with(b"\\E") || i + 2 == p.len()) {
            i = (i + 4).min(p.len());
            flags_since_repeat = true;
            continue;
        }
        after_repeat = false;
        t.flush_flags();
        let start = t.out.len();
        atom_product = 1;
        match c {
            b'\\' => {
                let (next, last) = translate_escape(p, i, &mut t)?;
                i = next;
                // `\Q...\E` emits several atoms (or none); a repetition applies to the last.
                atom = match last {
                    Some(last) => Some(last),
                    None if t.out.len() > start => Some(start),
                    None => atom,
                };
            }
            b'[' => {
                i = translate_class(p, i, &mut t)?;
                atom = Some(start);
            }
            b'(' => {
                i = translate_group(p, i, &mut t)?;
                enclosing_products.push(group_product);
                group_product = 1;
                atom = None;
            }
            b')' => {
                let (fold, group_start) = t
                    .groups
                    .pop()
                    .ok_or("unexpected ): unmatched parenthesis")?;
                t.fold = fold;
                t.out.push(')');
                i += 1;
                atom = Some(group_start);
                atom_product = group_product;
                group_product = enclosing_products.pop().unwrap_or(1).max(atom_product);
            }
            b'|' => {
                t.out.push('|');
                i += 1;
                atom = None;
            }
            b'^' | b'$' | b'.' => {
                t.out.push(c as char);
                i += 1;
                atom = Some(start);
            }
            _ => {
                push_literal(&mut t.out, c, t.fold);
                i += 1;
                atom = Some(start);
            }
        }
    }
    t.flush_flags();
    if !t.groups.is_empty() {
        return Err("missing ): unmatched parenthesis".into());
    }
    Ok(t.out)
}

/// A parsed `(?flags)` or `(?flags:` group opening.
struct FlagGroup {
    /// The flags in `regex` syntax (`im-s`): each flag once, last setting wins as in RE2.
    flags: String,
    /// The new `(?i)` state, if the group changes it.
    pub(super) fold: Option<bool>,
    /// Whether it opens a group (`(?flags:`) rather than setting flags until the group ends.
    opens_group: bool,
    /// The index after the syntax.
    pub(super) next: usize,
}

/// Parses `(?flags)` or `(?flags:` at `p[i]`; `None` when `p[i..]` is not a flags group.
fn parse_flags(p: &[u8], i: usize) -> Result<Option<FlagGroup>, String> {
    const FLAGS: [u8; 4] = [b'i', b'm', b's', b'U'];
    if p.get(i + 1) != Some(&b'?') {
        return Ok(None);
    }
    let mut j = i + 2;
    let mut negated = false;
    let mut flag_since_dash = false;
    let mut settings: [Option<bool>; 4] = [None; 4];
    loop {
        match p.get(j) {
            Some(&f) if FLAGS.contains(&f) => {
                let k = FLAGS.iter().position(|&x| x == f).unwrap_or(0);
                settings[k] = Some(!negated);
                flag_since_dash = true;
            }
            Some(b'-') if !negated => {
                negated = true;
                flag_since_dash = false;
            }
            Some(&end @ (b':' | b')')) => {
                if negated && !flag_since_dash {
                    return Err("invalid or unsupported Perl syntax: negation without flags".into());
                }
                let pick = |on: bool| -> String {
                    FLAGS
                        .iter()
                        .zip(settings)
                        .filter(|(_, s)| *s == Some(on))
                        .map(|(f, _)| *f as char)
                        .collect()
                };
                let (set, unset) = (pick(true), pick(false));
                let flags = if unset.is_empty() {
                    set
                } else {
                    format!("{set}-{unset}")
                };
                return Ok(Some(FlagGroup {
                    flags,
                    fold: settings[0],
                    opens_group: end == b':',
                    next: j + 1,
                }));
            }
            // Not a flags group: named groups and errors are handled by `translate_group`.
            _ => return Ok(None),
        }
        j += 1;
    }
}

/// Handles a flag-only group `(?flags)` at `p[*i]`: records it as pending and returns true.
fn translate_flag_group(p: &[u8], i: &mut usize, t: &mut Translation) -> Result<bool, String> {
    match parse_flags(p, *i)? {
        Some(group) if !group.opens_group => {
            if !group.flags.is_empty() {
                let _ = write!(t.pending_flags, "(?{})", group.flags);
            }
            if let Some(fold) = group.fold {
                t.fold = fold;
            }
            *i = group.next;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Translates a group opening at `p[i]` (`(`); returns the index after the opening syntax.
fn translate_group(p: &[u8], i: usize, t: &mut Translation) -> Result<usize, String> {
    let outer = (t.fold, t.out.len());
    // Captures are never used, so every group is emitted non-capturing; this also keeps
    // duplicate names (which RE2 accepts) out of `regex`.
    if p.get(i + 1) != Some(&b'?') {
        t.out.push_str("(?:");
        t.groups.push(outer);
        return Ok(i + 1);
    }
    if let Some(group) = parse_flags(p, i)? {
        let _ = write!(t.out, "(?{}:", group.flags);
        t.groups.push(outer);
        if let Some(fold) = group.fold {
            t.fold = fold;
        }
        return Ok(group.next);
    }
    let rest = &p[i + 2..];
    let name_start = if rest.starts_with(b"P<") {
        i + 4
    } else if rest.starts_with(b"<") && !rest.starts_with(b"<=") && !rest.starts_with(b"<!") {
        i + 3
    } else {
        let end = p[i..]
            .iter()
            .position(|&b| b == b')' || b == b':')
            .map_or(p.len(), |k| i + k + 1);
        return Err(format!(
            "invalid or unsupported Perl syntax: {}",
            String::from_utf8_lossy(&p[i..end])
        ));
    };
    let close = p[name_start..]
        .iter()
        .position(|&b| b == b'>')
        .ok_or("invalid named capture group: missing '>'")?;
    let name = &p[name_start..name_start + close];
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_') {
        return Err(format!(
            "invalid named capture group: {}",
            String::from_utf8_lossy(name)
        ));
    }
    t.out.push_str("(?:");
    t.groups.push(outer);
    Ok(name_start + close + 1)
}

/// Translates an escape outside a class; returns the index after it and, for `\\Q...\\E`,
/// where its last atom starts.
fn translate_escape(
    p: &[u8],
    i: usize,
    t: &mut Translation,
) -> Result<(usize, Option<usize>), String> {
    let Some(&c) = p.get(i + 1) else {
        return Err("trailing \\ at end of regular expression".into());
    };
    match c {
        b'C' => t.out.push_str("(?s:.)"),
        b'Q' => {
            let mut j = i + 2;
            let mut last = None;
            while j < p.len() {
                if p[j] == b'\\' && p.get(j + 1) == Some(&b'E') {
                    return Ok((j + 2, last));
                }
                last = Some(t.out.len());
                push_literal(&mut t.out, p[j], t.fold);
                j += 1;
            }
            return Ok((j, last));
        }
        b'b' | b'B' | b'A' | b'z' => {
            t.out.push('\\');
            t.out.push(c as char);
        }
        b'd' | b'D' | b's' | b'S' | b'w' | b'W' => {
            if let Some((set, negated)) = perl_class(c) {
                set.finish(negated, t.fold).emit(&mut t.out, t.fold);
            }
        }
        b'p' | b'P' => {
            let (set, negated, next) = unicode_class(p, i, t.fold)?;
            set.finish(negated, t.fold).emit(&mut t.out, t.fold);
            return Ok((next, None));
        }
        _ => {
            let (v, next) = literal_escape(p, i)?;
            push_literal(&mut t.out, v, t.fold);
            return Ok((next, None));
        }
    }
    Ok((i + 2, None))
}

/// One element of a character class: a single character (which may start a range) or a set.
enum ClassAtom {
    Char(u8),
    Set(ByteSet),
}

fn class_atom(p: &[u8], j: usize, fold: bool) -> Result<(ClassAtom, usize), String> {
    if p[j] != b'\\' {
        return Ok((ClassAtom::Char(p[j]), j + 1));
    }
    match p.get(j + 1) {
        Some(&c @ (b'd' | b'D' | b's' | b'S' | b'w' | b'W')) => match perl_class(c) {
            Some((set, negated)) => Ok((ClassAtom::Set(set.finish(negated, fold)), j + 2)),
            None => Err("invalid escape sequence in character class".into()),
        },
        Some(b'p' | b'P') => {
            let (set, negated, next) = unicode_class(p, j, fold)?;
            Ok((ClassAtom::Set(set.finish(negated, fold)), next))
        }
        _ => {
            let (v, next) = literal_escape(p, j)?;
            Ok((ClassAtom::Char(v), next))
        }
    }
}

/// Translates a character class starting at `p[i]` (`[`); returns the index after it.
fn translate_class(p: &[u8], i: usize, t: &mut Translation) -> Result<usize, String> {
    let mut j = i + 1;
    let negated = p.get(j) == Some(&b'^');
    if negated {
        j += 1;
    }
    let mut set = ByteSet::new();
    let mut first = true;
    loop {
        let Some(&c) = p.get(j) else {
            return Err("missing ]: unterminated character class".into());
        };
        // A ']' right after '[' or '[^' is a literal.
        if c == b']' && !first {
            j += 1;
            break;
        }
        first = false;
        // A POSIX class "[:name:]"; without a closing ":]" the '[' is a literal.
        if c == b'['
            && p.get(j + 1) == Some(&b':')
            && let Some(len) = p[j + 2..].windows(2).position(|w| w == b":]")
        {
            let name = &p[j + 2..j + 2 + len];
            let (class, class_negated) = posix_class(name).ok_or_else(|| {
                format!(
                    "invalid character class range: [:{}:]",
                    String::from_utf8_lossy(name)
                )
            })?;
            set.union(&class.finish(class_negated, t.fold));
            j += len + 4;
            continue;
        }
        let (atom, next) = class_atom(p, j, t.fold)?;
        j = next;
        match atom {
            ClassAtom::Set(class) => set.union(&class),
            ClassAtom::Char(lo) => {
                let is_range = p.get(j) == Some(&b'-') && p.get(j + 1).is_some_and(|&b| b != b']');
                if !is_range {
                    set.add_range(lo, lo);
                    continue;
                }
                let (hi, next) = class_atom(p, j + 1, t.fold)?;
                let ClassAtom::Char(hi) = hi else {
                    return Err("bad character class range: class escape as range end".into());
                };
                if hi < lo {
                    return Err(format!("bad character class range: {lo:#x}-{hi:#x}"));
                }
                set.add_range(lo, hi);
                j = next;
            }
        }
    }
    set.finish(negated, t.fold).emit(&mut t.out, t.fold);
    Ok(j)
}
