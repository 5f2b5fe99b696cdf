//! A fast reader for the block-style YAML that `kubectl get -o yaml` and serde_yaml_ng write: block
//! mappings and sequences (a sequence under a key may sit at the key's indentation), one-line plain, single-
//! and double-quoted scalars, `|` literal scalars, `{}` and `[]`, comments, and `---` between documents.
//!
//! It reads a document into a flat list of events (a tape) whose strings borrow from the text, and
//! deserializes typed objects straight from the tape: no `serde_json::Value` in between, no event parser's
//! bookkeeping per character, and one tape reused from document to document. A general YAML parser
//! (serde_yaml_ng's libyaml, or serde-saphyr's, which measured slower still) spent most of the time of
//! reading a dump of tens of thousands of pods on events alone; this reader needs no dependency.
//!
//! Anything outside that subset (flow collections other than `{}` and `[]`, anchors, tags, multi-line flow
//! scalars, folded scalars, tabs, carriage returns, …) and any error in the objects make the reader give up
//! with [`Unsupported`]; the caller then reads the whole file again the general way (serde_yaml_ng into a
//! `Value`), which handles all of YAML and words every error. So this reader only has to be right about
//! what it accepts, and there it gives what the general way gives: scalars resolve as serde_yaml_ng resolves
//! untagged scalars (null, booleans, integers, floats and strings of YAML 1.2's core schema; the rarer
//! spellings are left to it), and the deserializer calls a visitor as `&serde_json::Value`'s deserializer
//! does (numbers only for numbers, strings only for strings, an integer at or above zero as a `u64`), only
//! stricter where that is simpler (a struct is never read from a sequence, a map key is only a string, an
//! enum only a unit variant named by a string). Its tests hold it to serde_yaml_ng on the project's
//! snapshots rewritten in block style and on thousands of mutations of them.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};

/// The text is outside the subset this reader handles, or a typed object could not be read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unsupported;

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not read by the block-style reader")
    }
}

impl std::error::Error for Unsupported {}

impl de::Error for Unsupported {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Unsupported
    }
}

type Result<T> = std::result::Result<T, Unsupported>;

/// Deeper nesting than this is left to serde_yaml_ng (whose own limit is 128).
const MAX_DEPTH: usize = 100;

/// One event of a document. A collection's start knows its length and where it ends, so that skipping it
/// is one step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Event<'a> {
    Map {
        len: u32,
        end: u32,
    },
    Seq {
        len: u32,
        end: u32,
    },
    End,
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(&'a str),
    /// A string with escapes, an index into [`Tape::owned`].
    Owned(u32),
}

/// A document as events; a mapping's keys are strings, each followed by its value.
#[derive(Debug, Default)]
pub(super) struct Tape<'a> {
    events: Vec<Event<'a>>,
    owned: Vec<String>,
}

impl<'a> Tape<'a> {
    fn clear(&mut self) {
        self.events.clear();
        self.owned.clear();
    }

    fn push(&mut self, e: Event<'a>) {
        self.events.push(e);
    }

    fn push_text(&mut self, s: Cow<'a, str>) -> Result<()> {
        match s {
            Cow::Borrowed(s) => {
                self.events.push(Event::Str(s));
                Ok(())
            }
            Cow::Owned(s) => self.push_owned(s),
        }
    }

    fn push_owned(&mut self, s: String) -> Result<()> {
        let i = u32::try_from(self.owned.len()).map_err(|_| Unsupported)?;
        self.owned.push(s);
        self.events.push(Event::Owned(i));
        Ok(())
    }

    /// Starts a collection; [`Tape::close`] fills in its length and end.
    fn open(&mut self, map: bool) -> usize {
        let i = self.events.len();
        self.events.push(if map { Event::Map { len: 0, end: 0 } } else { Event::Seq { len: 0, end: 0 } });
        i
    }

    fn close(&mut self, start: usize, n: usize) -> Result<()> {
        let end = u32::try_from(self.events.len()).map_err(|_| Unsupported)?;
        let len = u32::try_from(n).map_err(|_| Unsupported)?;
        self.events.push(Event::End);
        self.events[start] = match self.events[start] {
            Event::Map { .. } => Event::Map { len, end },
            _ => Event::Seq { len, end },
        };
        Ok(())
    }

    /// The document's root.
    pub(super) fn root(&self) -> Node<'_, 'a> {
        Node { tape: self, index: 0 }
    }
}

/// A node of a [`Tape`].
#[derive(Clone, Copy)]
pub(super) struct Node<'t, 'a> {
    tape: &'t Tape<'a>,
    index: usize,
}

impl<'t, 'a> Node<'t, 'a> {
    fn event(&self) -> Event<'a> {
        self.tape.events[self.index]
    }

    /// The index just past this node.
    fn next(&self) -> usize {
        match self.event() {
            Event::Map { end, .. } | Event::Seq { end, .. } => end as usize + 1,
            _ => self.index + 1,
        }
    }

    /// Whether the node is null.
    pub(super) fn is_null(&self) -> bool {
        self.event() == Event::Null
    }

    /// Whether the node is a mapping.
    pub(super) fn is_map(&self) -> bool {
        matches!(self.event(), Event::Map { .. })
    }

    /// The node's text, if it is a string.
    pub(super) fn as_str(&self) -> Option<&'t str> {
        match self.event() {
            Event::Str(s) => Some(s),
            Event::Owned(i) => Some(self.tape.owned[i as usize].as_str()),
            _ => None,
        }
    }

    /// The items of a sequence.
    pub(super) fn items(&self) -> Option<Vec<Node<'t, 'a>>> {
        let Event::Seq { end, len } = self.event() else { return None };
        let mut out = Vec::with_capacity(len as usize);
        let mut i = self.index + 1;
        while i < end as usize {
            let item = Node { tape: self.tape, index: i };
            i = item.next();
            out.push(item);
        }
        Some(out)
    }

    /// The value of `key` in a mapping; `Err` when the key is there more than once (the general reader keeps
    /// the last, and the typed objects may not), `Ok(None)` when it is missing or this is no mapping.
    pub(super) fn get(&self, key: &str) -> Result<Option<Node<'t, 'a>>> {
        let Event::Map { end, .. } = self.event() else { return Ok(None) };
        let mut found = None;
        let mut i = self.index + 1;
        while i < end as usize {
            let k = Node { tape: self.tape, index: i };
            let v = Node { tape: self.tape, index: i + 1 };
            if k.as_str() == Some(key) {
                if found.is_some() {
                    return Err(Unsupported);
                }
                found = Some(v);
            }
            i = v.next();
        }
        Ok(found)
    }

    /// Deserializes a `T` from the node.
    pub(super) fn deserialize<T: DeserializeOwned>(&self) -> Result<T> {
        let mut cursor = Cursor { tape: self.tape, pos: self.index };
        T::deserialize(&mut cursor)
    }
}

/// Reads documents one after the other.
pub(super) struct Reader<'a> {
    text: &'a str,
    /// The next line with content (past blank and comment lines).
    next: Next,
    tape: Tape<'a>,
}

/// A line with content.
#[derive(Debug, Clone, Copy)]
struct Line {
    start: usize,
    indent: usize,
    /// The offset of its `\n`, or the text's length.
    end: usize,
}

impl Line {
    fn content(&self) -> usize {
        self.start + self.indent
    }
}

#[derive(Debug, Clone, Copy)]
enum Next {
    Line(Line),
    /// `---` at the start of a line, which ends the offset's line.
    Marker(usize),
    Eof,
}

/// Whether the text holds only characters this reader handles: no tab, carriage return or other control
/// character, no byte-order mark, and none of the characters YAML 1.1 counts as line breaks.
fn plain_characters(text: &str) -> bool {
    // Printable ASCII and newlines, a block at a time (without an early exit, the check vectorizes); a block
    // with anything else is looked at character by character.
    let printable = |b: u8| b.wrapping_sub(0x20) < 0x5f || b == b'\n';
    let mut start = 0;
    for block in text.as_bytes().chunks(64) {
        let end = start + block.len();
        if !block.iter().fold(true, |ok, &b| ok & printable(b)) {
            // A block may split a character: look from the character holding its first byte on.
            let mut from = start;
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            let to = (end..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
            let allowed = |c: char| {
                let code = u32::from(c);
                if code < 0x80 {
                    return printable(code as u8);
                }
                !((0x80..0xa0).contains(&code) || matches!(code, 0x2028 | 0x2029 | 0xfeff | 0xfffe | 0xffff))
            };
            if !text[from..to].chars().all(allowed) {
                return false;
            }
        }
        start = end;
    }
    true
}

fn is_space_or_end(bytes: &[u8], i: usize) -> bool {
    i >= bytes.len() || bytes[i] == b' ' || bytes[i] == b'\n'
}

impl<'a> Reader<'a> {
    /// A reader of `text`, or `Err` when the text holds characters it leaves to serde_yaml_ng.
    pub(super) fn new(text: &'a str) -> Result<Self> {
        if !plain_characters(text) {
            return Err(Unsupported);
        }
        let mut reader = Reader { text, next: Next::Eof, tape: Tape::default() };
        reader.next = reader.scan(0)?;
        Ok(reader)
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn line_end(&self, from: usize) -> usize {
        self.text[from..].find('\n').map_or(self.text.len(), |i| from + i)
    }

    /// The first line with content at or after offset `pos` (a line start).
    fn scan(&self, mut pos: usize) -> Result<Next> {
        let bytes = self.bytes();
        while pos < bytes.len() {
            let end = self.line_end(pos);
            let mut c = pos;
            while c < end && bytes[c] == b' ' {
                c += 1;
            }
            if c == end || bytes[c] == b'#' {
                pos = end + 1;
                continue;
            }
            if c == pos {
                let line = &bytes[pos..end];
                if line.starts_with(b"---") && is_space_or_end(bytes, pos + 3) {
                    // Anything after the marker (a node, a tag, a comment) is left to the general reader.
                    if line[3..].iter().any(|b| *b != b' ') {
                        return Err(Unsupported);
                    }
                    return Ok(Next::Marker(end));
                }
                if (line.starts_with(b"...") && is_space_or_end(bytes, pos + 3)) || line[0] == b'%' {
                    return Err(Unsupported);
                }
            }
            return Ok(Next::Line(Line { start: pos, indent: c - pos, end }));
        }
        Ok(Next::Eof)
    }

    /// Moves past the line ending at `end`.
    fn advance(&mut self, end: usize) -> Result<()> {
        self.next = self.scan(end + 1)?;
        Ok(())
    }

    /// The next document, `None` after the last; an empty document is a null.
    pub(super) fn next_document(&mut self) -> Result<Option<&Tape<'a>>> {
        self.tape.clear();
        match self.next {
            Next::Eof => return Ok(None),
            Next::Marker(end) => {
                self.advance(end)?;
                if let Next::Line(line) = self.next {
                    self.node_at(line, line.content(), 0)?;
                } else {
                    self.tape.push(Event::Null);
                }
            }
            Next::Line(line) => self.node_at(line, line.content(), 0)?,
        }
        // What is left of the document must be nothing: a line here is indented wrongly.
        if let Next::Line(_) = self.next {
            return Err(Unsupported);
        }
        Ok(Some(&self.tape))
    }

    /// A block node that starts at offset `at` of `line`: a sequence or a mapping.
    fn node_at(&mut self, line: Line, at: usize, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        let bytes = self.bytes();
        let column = at - line.start;
        if bytes[at] == b'-' && is_space_or_end(bytes, at + 1) {
            return self.sequence(line, column, depth);
        }
        self.mapping(line, column, depth)
    }

    /// The value of a key or a sequence entry with nothing after it on its line: a block node on the next
    /// lines, indented more than `parent`, or (under a key) a sequence at the key's own indentation; null
    /// when neither follows.
    fn block_value(&mut self, parent: usize, compact: bool, depth: usize) -> Result<()> {
        match self.next {
            Next::Line(l) if l.indent > parent => self.node_at(l, l.content(), depth),
            Next::Line(l) if compact && l.indent == parent && self.is_entry(l) => self.sequence(l, l.indent, depth),
            _ => {
                self.tape.push(Event::Null);
                Ok(())
            }
        }
    }

    /// Whether the line is a sequence entry (`- …` or a lone `-`).
    fn is_entry(&self, l: Line) -> bool {
        let bytes = self.bytes();
        bytes[l.content()] == b'-' && is_space_or_end(bytes, l.content() + 1)
    }

    /// A block sequence whose entries start at `column`, the first one on `line`.
    fn sequence(&mut self, mut line: Line, column: usize, depth: usize) -> Result<()> {
        let start = self.tape.open(false);
        let mut n = 0;
        loop {
            // The entry's `-` is at `line.start + column`.
            self.value(line, line.start + column + 1, column, false, depth + 1)?;
            n += 1;
            match self.next {
                Next::Line(l) if l.indent == column && self.is_entry(l) => line = l,
                Next::Line(l) if l.indent > column => return Err(Unsupported),
                _ => break,
            }
        }
        self.tape.close(start, n)
    }

    /// A block mapping whose keys start at `column`, the first one on `line`.
    fn mapping(&mut self, mut line: Line, column: usize, depth: usize) -> Result<()> {
        let start = self.tape.open(true);
        let mut n = 0;
        loop {
            let at = line.start + column;
            let after = self.key(at, line.end)?;
            self.value(line, after, column, true, depth + 1)?;
            n += 1;
            match self.next {
                Next::Line(l) if l.indent == column && !self.is_entry(l) => line = l,
                Next::Line(l) if l.indent >= column => return Err(Unsupported),
                _ => break,
            }
        }
        self.tape.close(start, n)
    }

    /// Reads the key at `at` onto the tape; returns the offset just past its `:`.
    fn key(&mut self, at: usize, end: usize) -> Result<usize> {
        let bytes = self.bytes();
        match bytes[at] {
            b'\'' | b'"' => {
                let (key, close) = self.quoted(at, end)?;
                // The `:` must follow the closing quote at once, then a space or the end of the line.
                if close < end && bytes[close] == b':' && is_space_or_end(bytes, close + 1) {
                    self.tape.push_text(key)?;
                    Ok(close + 1)
                } else {
                    Err(Unsupported)
                }
            }
            b if b == b'-' || is_indicator(b) => Err(Unsupported),
            _ => {
                let Plain::Key(colon) = plain(bytes, at, end) else { return Err(Unsupported) };
                if bytes[colon - 1] == b' ' || colon - at > 1000 {
                    return Err(Unsupported);
                }
                self.tape.push(Event::Str(&self.text[at..colon]));
                Ok(colon + 1)
            }
        }
    }

    /// The value after a key's `:` or an entry's `-` (at offset `at` of `line`, in a collection whose
    /// entries start at `column`). In a sequence (`!in_map`) the value may itself be a mapping or a
    /// sequence starting on the entry's line.
    fn value(&mut self, line: Line, at: usize, column: usize, in_map: bool, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        let bytes = self.bytes();
        let mut c = at;
        while c < line.end && bytes[c] == b' ' {
            c += 1;
        }
        if c == line.end || bytes[c] == b'#' {
            self.advance(line.end)?;
            return self.block_value(column, in_map, depth);
        }
        match bytes[c] {
            b'|' => return self.literal(line, c, column),
            b'\'' | b'"' => {
                let (text, close) = self.quoted(c, line.end)?;
                if close < line.end && bytes[close] == b':' && is_space_or_end(bytes, close + 1) {
                    // A mapping whose first key is quoted, on an entry's line.
                    if in_map {
                        return Err(Unsupported);
                    }
                    return self.mapping(line, c - line.start, depth);
                }
                self.rest_is_blank(close, line.end)?;
                self.tape.push_text(text)?;
            }
            b'{' | b'[' => {
                if c + 1 >= line.end || bytes[c + 1] != if bytes[c] == b'{' { b'}' } else { b']' } {
                    return Err(Unsupported);
                }
                let start = self.tape.open(bytes[c] == b'{');
                self.tape.close(start, 0)?;
                self.rest_is_blank(c + 2, line.end)?;
            }
            b'-' if is_space_or_end(bytes, c + 1) => {
                if in_map {
                    return Err(Unsupported);
                }
                return self.sequence(line, c - line.start, depth);
            }
            b if is_indicator(b) => return Err(Unsupported),
            _ => match plain(bytes, c, line.end) {
                // A key after a key would be a mapping YAML does not allow here.
                Plain::Key(_) if in_map => return Err(Unsupported),
                Plain::Key(_) => return self.mapping(line, c - line.start, depth),
                Plain::Scalar(end) => self.tape.push(resolve(&self.text[c..end])?),
            },
        }
        self.advance(line.end)
    }

    fn rest_is_blank(&self, from: usize, end: usize) -> Result<()> {
        let bytes = self.bytes();
        let mut c = from;
        while c < end && bytes[c] == b' ' {
            c += 1;
        }
        // A comment needs a space before it.
        if c == end || (bytes[c] == b'#' && c > from) { Ok(()) } else { Err(Unsupported) }
    }

    /// The one-line quoted scalar opening at `open`, and the offset past its closing quote.
    fn quoted(&self, open: usize, end: usize) -> Result<(Cow<'a, str>, usize)> {
        let bytes = self.bytes();
        let quote = bytes[open];
        let mut owned: Option<String> = None;
        let mut from = open + 1;
        let mut i = open + 1;
        while i < end {
            let b = bytes[i];
            if quote == b'\'' && b == b'\'' {
                if i + 1 < end && bytes[i + 1] == b'\'' {
                    owned.get_or_insert_with(String::new).push_str(&self.text[from..=i]);
                    i += 2;
                    from = i;
                    continue;
                }
                return Ok((self.finish_quoted(owned, from, i), i + 1));
            }
            if quote == b'"' && b == b'"' {
                return Ok((self.finish_quoted(owned, from, i), i + 1));
            }
            if quote == b'"' && b == b'\\' {
                let s = owned.get_or_insert_with(String::new);
                s.push_str(&self.text[from..i]);
                i = unescape(self.text, i, end, s)?;
                from = i;
                continue;
            }
            i += 1;
        }
        // The scalar goes on past the line.
        Err(Unsupported)
    }

    fn finish_quoted(&self, owned: Option<String>, from: usize, close: usize) -> Cow<'a, str> {
        match owned {
            None => Cow::Borrowed(&self.text[from..close]),
            Some(mut s) => {
                s.push_str(&self.text[from..close]);
                Cow::Owned(s)
            }
        }
    }

    /// A `|` literal scalar whose header is at offset `at` of `line`, in a collection whose entries start at
    /// `column`.
    fn literal(&mut self, line: Line, at: usize, column: usize) -> Result<()> {
        let bytes = self.bytes();
        let mut c = at + 1;
        let chomp = match bytes.get(c) {
            Some(b'-') => Some(false),
            Some(b'+') => Some(true),
            _ => None,
        };
        if chomp.is_some() {
            c += 1;
        }
        self.rest_is_blank(c, line.end)?;
        // Leading empty lines, then content lines indented at least as much as the first one.
        let mut out = String::new();
        let mut indent: Option<usize> = None;
        let mut leading_spaces = 0;
        let mut breaks = 0;
        let mut pos = line.end + 1;
        loop {
            if pos >= bytes.len() {
                // The scalar runs to the end of the text: left to the general reader.
                return Err(Unsupported);
            }
            let end = self.line_end(pos);
            let mut spaces = 0;
            while pos + spaces < end && bytes[pos + spaces] == b' ' {
                spaces += 1;
            }
            let blank = pos + spaces == end;
            match indent {
                None if blank => {
                    leading_spaces = leading_spaces.max(spaces);
                    breaks += 1;
                }
                None => {
                    if spaces <= column || leading_spaces > spaces || end == bytes.len() {
                        return Err(Unsupported);
                    }
                    indent = Some(spaces);
                    out.extend(std::iter::repeat_n('\n', breaks));
                    breaks = 0;
                    out.push_str(&self.text[pos + spaces..end]);
                }
                Some(n) if blank && spaces <= n => breaks += 1,
                Some(n) if spaces < n => break,
                Some(n) => {
                    if end == bytes.len() {
                        return Err(Unsupported);
                    }
                    out.push('\n');
                    out.extend(std::iter::repeat_n('\n', breaks));
                    breaks = 0;
                    out.push_str(&self.text[pos + n..end]);
                }
            }
            pos = end + 1;
        }
        match chomp {
            Some(false) => {}
            None => out.push('\n'),
            Some(true) => out.extend(std::iter::repeat_n('\n', breaks + 1)),
        }
        self.tape.push_owned(out)?;
        self.next = self.scan(pos)?;
        Ok(())
    }
}

/// Bytes a plain scalar may not start with, as far as this reader goes (a `-` may start one when no space
/// follows it).
fn is_indicator(b: u8) -> bool {
    matches!(b, b'?' | b':' | b',' | b'[' | b']' | b'{' | b'}' | b'#' | b'&' | b'*' | b'!' | b'|')
        || matches!(b, b'>' | b'\'' | b'"' | b'%' | b'@' | b'`')
}

/// What a line holds from a plain scalar's start on.
enum Plain {
    /// A key: the offset of its `:` (followed by a space or the end of the line).
    Key(usize),
    /// A scalar ending (before any comment and trailing spaces) at the offset.
    Scalar(usize),
}

/// Reads a plain scalar from `at` to the end of the line at `end`.
fn plain(bytes: &[u8], at: usize, end: usize) -> Plain {
    let mut i = at;
    let mut last = at;
    while i < end {
        match bytes[i] {
            b':' if i + 1 == end || bytes[i + 1] == b' ' => return Plain::Key(i),
            b'#' if i > at && bytes[i - 1] == b' ' => break,
            b' ' => {}
            _ => last = i + 1,
        }
        i += 1;
    }
    Plain::Scalar(last)
}

/// An untagged plain scalar's value, as serde_yaml_ng resolves it. Spellings whose resolution is
/// intricate (`+` signs, `0x`/`0o`/`0b` radixes, `.inf` and `.nan`, integers too large for 64 bits) are
/// left to serde_yaml_ng.
fn resolve(s: &str) -> Result<Event<'_>> {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Event::Null),
        "true" | "True" | "TRUE" => return Ok(Event::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Event::Bool(false)),
        _ => {}
    }
    let first = s.as_bytes()[0];
    if !(first.is_ascii_digit() || first == b'-' || first == b'.' || first == b'+') {
        // Not a number: Rust's float syntax that starts with a letter (`inf`, `nan`, `infinity`) is never
        // finite, and serde_yaml_ng keeps only finite floats.
        return Ok(Event::Str(s));
    }
    if first == b'+' {
        return Err(Unsupported);
    }
    let negative = first == b'-';
    let digits = if negative { &s[1..] } else { s };
    // `0x`, `0o` and `0b` make an integer when valid digits of the radix follow (and nothing else): left to
    // serde_yaml_ng. Otherwise (a UID such as `0b6f2a8e-…`) the spelling goes on to the checks below.
    let radix = match digits.get(..2) {
        Some("0x") => Some(16),
        Some("0o") => Some(8),
        Some("0b") => Some(2),
        _ => None,
    };
    if let Some(radix) = radix
        && digits.len() > 2
        && digits[2..].chars().all(|c| c.is_digit(radix))
    {
        return Err(Unsupported);
    }
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        // Leading zeros make a string (YAML 1.2), and serde_yaml_ng does not try it as a float either.
        if digits.len() > 1 && digits.starts_with('0') {
            return Ok(Event::Str(s));
        }
        return if negative {
            // -0 is zero, which `serde_json::Value` holds (and hands on) as a `u64`.
            match s.parse::<i64>().map_err(|_| Unsupported)? {
                0 => Ok(Event::U64(0)),
                n => Ok(Event::I64(n)),
            }
        } else {
            s.parse::<u64>().map(Event::U64).map_err(|_| Unsupported)
        };
    }
    if matches!(digits, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN") {
        return Err(Unsupported);
    }
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(Event::F64(f)),
        _ => Ok(Event::Str(s)),
    }
}

/// Appends the escape sequence at offset `at` (a backslash) of a double-quoted scalar to `out`; returns
/// the offset past it. The escapes libyaml knows, less the line-continuing ones.
fn unescape(text: &str, at: usize, end: usize, out: &mut String) -> Result<usize> {
    let bytes = text.as_bytes();
    let Some(&e) = bytes.get(at + 1).filter(|_| at + 1 < end) else { return Err(Unsupported) };
    let simple = match e {
        b'0' => Some('\0'),
        b'a' => Some('\x07'),
        b'b' => Some('\x08'),
        b't' => Some('\t'),
        b'n' => Some('\n'),
        b'v' => Some('\x0b'),
        b'f' => Some('\x0c'),
        b'r' => Some('\r'),
        b'e' => Some('\x1b'),
        b' ' => Some(' '),
        b'"' => Some('"'),
        b'/' => Some('/'),
        b'\\' => Some('\\'),
        b'N' => Some('\u{85}'),
        b'_' => Some('\u{a0}'),
        b'L' => Some('\u{2028}'),
        b'P' => Some('\u{2029}'),
        _ => None,
    };
    if let Some(c) = simple {
        out.push(c);
        return Ok(at + 2);
    }
    let width = match e {
        b'x' => 2,
        b'u' => 4,
        b'U' => 8,
        _ => return Err(Unsupported),
    };
    let hex = text.get(at + 2..at + 2 + width).filter(|_| at + 2 + width <= end).ok_or(Unsupported)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Unsupported);
    }
    let code = u32::from_str_radix(hex, 16).map_err(|_| Unsupported)?;
    out.push(char::from_u32(code).ok_or(Unsupported)?);
    Ok(at + 2 + width)
}

/// Deserializes from a tape, as `&serde_json::Value` would from the same document.
struct Cursor<'t, 'a> {
    tape: &'t Tape<'a>,
    pos: usize,
}

impl<'t, 'a> Cursor<'t, 'a> {
    fn peek(&self) -> Event<'a> {
        self.tape.events[self.pos]
    }

    fn skip(&mut self) {
        self.pos = Node { tape: self.tape, index: self.pos }.next();
    }

    fn text(&self, e: Event<'a>) -> Option<&'t str> {
        match e {
            Event::Str(s) => Some(s),
            Event::Owned(i) => Some(self.tape.owned[i as usize].as_str()),
            _ => None,
        }
    }

    fn number<'de, V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        let e = self.peek();
        self.pos += 1;
        match e {
            Event::U64(n) => visitor.visit_u64(n),
            Event::I64(n) => visitor.visit_i64(n),
            Event::F64(n) => visitor.visit_f64(n),
            _ => Err(Unsupported),
        }
    }

    fn string<'de, V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        let s = self.text(self.peek()).ok_or(Unsupported)?;
        self.pos += 1;
        visitor.visit_str(s)
    }

    fn map<'de, V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        let Event::Map { len, end } = self.peek() else { return Err(Unsupported) };
        self.pos += 1;
        let value = visitor.visit_map(Entries { cursor: self, end: end as usize, left: len as usize })?;
        // Every entry must have been read, as `serde_json::Value` requires.
        if self.pos != end as usize {
            return Err(Unsupported);
        }
        self.pos += 1;
        Ok(value)
    }

    fn seq<'de, V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        let Event::Seq { len, end } = self.peek() else { return Err(Unsupported) };
        self.pos += 1;
        let value = visitor.visit_seq(Items { cursor: self, end: end as usize, left: len as usize })?;
        if self.pos != end as usize {
            return Err(Unsupported);
        }
        self.pos += 1;
        Ok(value)
    }
}

impl<'de> de::Deserializer<'de> for &mut Cursor<'_, '_> {
    type Error = Unsupported;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Event::Map { .. } => self.map(visitor),
            Event::Seq { .. } => self.seq(visitor),
            Event::End => Err(Unsupported),
            Event::Null => {
                self.pos += 1;
                visitor.visit_unit()
            }
            Event::Bool(b) => {
                self.pos += 1;
                visitor.visit_bool(b)
            }
            Event::U64(_) | Event::I64(_) | Event::F64(_) => self.number(visitor),
            Event::Str(_) | Event::Owned(_) => self.string(visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let Event::Bool(b) = self.peek() else { return Err(Unsupported) };
        self.pos += 1;
        visitor.visit_bool(b)
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.number(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek() == Event::Null {
            self.pos += 1;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek() != Event::Null {
            return Err(Unsupported);
        }
        self.pos += 1;
        visitor.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.seq(visitor)
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value> {
        self.seq(visitor)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _: &'static str, _: usize, visitor: V) -> Result<V::Value> {
        self.seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.map(visitor)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        // A unit variant by name; variants with data are left to the general reader.
        let s = self.text(self.peek()).ok_or(Unsupported)?;
        self.pos += 1;
        visitor.visit_enum(UnitVariant(s))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip();
        visitor.visit_unit()
    }
}

struct Entries<'c, 't, 'a> {
    cursor: &'c mut Cursor<'t, 'a>,
    end: usize,
    left: usize,
}

impl<'de> de::MapAccess<'de> for Entries<'_, '_, '_> {
    type Error = Unsupported;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.cursor.pos >= self.end {
            return Ok(None);
        }
        let key = self.cursor.text(self.cursor.peek()).ok_or(Unsupported)?;
        self.cursor.pos += 1;
        self.left = self.left.saturating_sub(1);
        seed.deserialize(Key(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.cursor)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

struct Items<'c, 't, 'a> {
    cursor: &'c mut Cursor<'t, 'a>,
    end: usize,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Items<'_, '_, '_> {
    type Error = Unsupported;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.cursor.pos >= self.end {
            return Ok(None);
        }
        self.left = self.left.saturating_sub(1);
        seed.deserialize(&mut *self.cursor).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// A mapping key: always a string, as in a `serde_json::Value` object.
struct Key<'t>(&'t str);

impl<'de> de::Deserializer<'de> for Key<'_> {
    type Error = Unsupported;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_str(self.0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_unit()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_i8<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_i128<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_u128<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
    fn deserialize_enum<V: Visitor<'de>>(self, _: &'static str, _: &'static [&'static str], _: V) -> Result<V::Value> {
        Err(Unsupported)
    }

    serde::forward_to_deserialize_any! {
        char str string bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

/// A unit enum variant named by a string.
struct UnitVariant<'t>(&'t str);

impl<'de> de::EnumAccess<'de> for UnitVariant<'_> {
    type Error = Unsupported;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        Ok((seed.deserialize(Key(self.0))?, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'_> {
    type Error = Unsupported;

    fn unit_variant(self) -> Result<()> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _: T) -> Result<T::Value> {
        Err(Unsupported)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value> {
        Err(Unsupported)
    }

    fn struct_variant<V: Visitor<'de>>(self, _: &'static [&'static str], _: V) -> Result<V::Value> {
        Err(Unsupported)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::Value;

    /// The documents of `text` as this reader reads them (`None` when it gives up), nulls left out.
    fn block_documents(text: &str) -> Option<Vec<Value>> {
        let mut reader = Reader::new(text).ok()?;
        let mut out = Vec::new();
        while let Some(tape) = reader.next_document().ok()? {
            let value: Value = tape.root().deserialize().ok()?;
            if !value.is_null() {
                out.push(value);
            }
        }
        Some(out)
    }

    /// The documents of `text` as serde_yaml_ng reads them into `Value`s, nulls left out.
    fn general_documents(text: &str) -> std::result::Result<Vec<Value>, serde_yaml_ng::Error> {
        let mut out = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let value = Value::deserialize(document)?;
            if !value.is_null() {
                out.push(value);
            }
        }
        Ok(out)
    }

    /// Whether this reader reads `text`; when it does, it must read what serde_yaml_ng reads.
    pub(in crate::snapshot) fn agrees(text: &str) -> bool {
        let Some(block) = block_documents(text) else { return false };
        match general_documents(text) {
            Ok(general) => assert_eq!(block, general, "read differently:\n{text}"),
            Err(e) => panic!("serde_yaml_ng rejects what the block reader reads ({e}):\n{text}"),
        }
        true
    }

    #[test]
    fn plain_scalars_resolve_as_serde_yaml_ng_resolves_them() {
        let read = [
            "1",
            "-1",
            "0",
            "-0",
            "00",
            "-00",
            "0123",
            "-0123",
            "1.5",
            "-1.5",
            ".5",
            "-.5",
            "1.",
            "1e3",
            "1E3",
            "1e+3",
            "1e-3",
            "0e0",
            "-0.0",
            "1e400",
            "-1e400",
            "inf",
            "-inf",
            "nan",
            "NaN",
            "infinity",
            "1_000",
            "0X1F",
            "0b6f2a8e-1c2d",
            "0x",
            "0o",
            "0b",
            "0b12",
            "0o8",
            "0xg",
            "-0b2",
            "0x-1",
            "0b+1",
            "0b1e5",
            "18446744073709551615",
            "-9223372036854775808",
            "true",
            "True",
            "TRUE",
            "tRue",
            "false",
            "False",
            "FALSE",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "~",
            "null",
            "Null",
            "NULL",
            "nULL",
            "1000m",
            "256Mi",
            "0.21000000000000002",
            "2026-01-01T00:00:00Z",
            "2026-01-01",
            "1:30",
            "a:b",
            ".",
            "..",
            "...",
            "-a",
            "-1a",
            "1-2",
            "3.14.15",
            "1e",
            "e1",
            "E5",
            "-e5",
            "a b  c",
            "x#y",
            "a'b",
            "a\"b",
            "c,d",
            "a]",
            "ü",
            "💥",
            "foo  ",
            "12 # comment",
            "v1 #",
            "-- a",
            "--",
            "1.5e3x",
        ];
        for s in read {
            let text = format!("k: {s}\n");
            assert!(agrees(&text), "{s:?} is left to serde_yaml_ng");
        }
        let left = [
            "+1",
            "+.5",
            "-",
            "0x1F",
            "-0x1",
            "0o17",
            "0b1",
            "0b10",
            "0xAbC",
            "-0o7",
            ".inf",
            "-.inf",
            ".nan",
            "18446744073709551616",
            "-9223372036854775809",
            "&a x",
            "*a",
            "!!str x",
            "? x",
            ": x",
            "{x",
            "a: b",
            "a:",
            "@x",
            "`x",
            "%x",
            ">\n  x",
            "{a: 1}",
            "[1]",
            "|2\n  x",
        ];
        for s in left {
            let text = format!("k: {s}\n");
            assert!(!agrees(&text), "{s:?} should be left to serde_yaml_ng");
        }
    }

    #[test]
    fn quoted_scalars_keys_and_escapes() {
        for text in [
            "k: 'it''s'\n",
            "k: ''\n",
            "k: \"\"\n",
            "k: '1'\n",
            "k: \"true\"\n",
            "k: 'a: b # c'\n",
            "k: \"a\\tb\\\\c\\\"d\\/e\\n\"\n",
            "k: \"\\u00e9\\x41\\U0001F4A5\\0\\a\\b\\e\\f\\v\\r\\N\\_\\L\\P\\ \"\n",
            "'a b': 1\n\"c\": 2\n",
            "'k''': x # comment\n",
            "k: 'x'   # comment\n",
            "- 'a': 1\n  b: 2\n- \"c\": 3\n",
        ] {
            assert!(agrees(text), "{text:?} is left to serde_yaml_ng");
        }
        for text in [
            "k: 'a\n  b'\n",
            "k: \"a\\\n  b\"\n",
            "k: 'a'b\n",
            "k: \"\\q\"\n",
            "k: \"\\ud800\"\n",
            "'k' : 1\n",
            "k: 'x'#c\n",
        ] {
            assert!(!agrees(text), "{text:?} should be left to serde_yaml_ng");
        }
    }

    #[test]
    fn literal_scalars() {
        for text in [
            "k: |\n  a\n  b\nn: 1\n",
            "k: |-\n  a\n  b\nn: 1\n",
            "k: |+\n  a\n\n\nn: 1\n",
            "k: |\n  a\n\n\nn: 1\n",
            "k: |\n\n  a\n\n    b\n   \n  c\n      \nn: 1\n",
            "k: |\n  # not a comment\n  x: y\n# a comment\nn: 1\n",
            "k: | # a comment\n  a\nn: 1\n",
            "m:\n  k: |-\n    {\"a\": 1}\n  j: 2\n",
            "- |\n  a\n- b\n",
            "s:\n- |-\n  a\n  b\n- c\n",
            "k: |\n  a\n   \nn: 1\n",
        ] {
            assert!(agrees(text), "{text:?} is left to serde_yaml_ng");
        }
        for text in
            ["k: |\n  a\n", "k: |\nn: 1\n", "k: |\n    \n  a\nn: 1\n", "k: >\n  a\nn: 1\n", "k: |1\n  a\nn: 1\n"]
        {
            assert!(!agrees(text), "{text:?} should be left to serde_yaml_ng");
        }
    }

    #[test]
    fn block_collections_and_documents() {
        for text in [
            "",
            "# only a comment\n",
            "---\n",
            "---\n---\n",
            "a: 1\n---\nb: 2\n",
            "---\na: 1\n---\n\n---\nb: 2\n",
            "a:\n  b:\n    c: 1\n  d: 2\ne: 3\n",
            "a:\n- 1\n- 2\nb:\n  - x\n  -   y\n",
            "a:\n- b: 1\n  c:\n  - 2\n  - 3\n  d: {}\n- e: []\n-\n- f\n",
            "- - a\n  - b\n- - c\n",
            "-   a: 1\n    b: 2\n",
            "a:\nb: ~\nc: \n",
            "  a: 1\n  b: 2\n",
            "a: 1 # trailing\n# between\n   # indented comment\nb: 2\n",
            "a:\n  # comment in a block\n  b: 1\n",
            "a: {}   # empty\nb: []\n",
            "a: b\na: c\n",
            "metadata:\n  labels:\n    app.kubernetes.io/name: web\n    node.kubernetes.io/instance-type: m5.large\n",
            "k: a#b\nj: c:d\n",
            "k: ---\n",
            "- a\n- ---x\n",
        ] {
            assert!(agrees(text), "{text:?} is left to serde_yaml_ng");
        }
        for text in [
            "a: 1\n b: 2\n",
            "a:\n    b: 1\n  c: 2\n",
            "a: 1\n- b\n",
            "- a\nb: 1\n",
            "a: b\n  c\n",
            "- a\n  b\n",
            "a:\n  b\n",
            "scalar\n",
            "a: 1\n\tb: 2\n",
            "a: 1\r\nb: 2\r\n",
            "--- a: 1\n",
            "%YAML 1.2\n---\na: 1\n",
            "a: 1\n...\n",
            "\u{feff}a: 1\n",
            "a: x\u{85}y\n",
            "a: &x 1\nb: *x\n",
            "? a\n: b\n",
            "a : 1\n",
            "-a: 1\n",
            "a: - b\n",
        ] {
            assert!(!agrees(text), "{text:?} should be left to serde_yaml_ng");
        }
    }

    #[test]
    fn deep_nesting_is_left_to_serde_yaml_ng() {
        let mut text = String::new();
        for depth in 0..150 {
            text.push_str(&" ".repeat(depth * 2));
            text.push_str("a:\n");
        }
        assert!(!agrees(&text));
    }
}
