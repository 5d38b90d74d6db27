//! Shell-style patterns over '/'-separated relative paths: `*` (any characters but '/'), `?`
//! (one character), `[abc]`, `[a-z]`, `[!abc]`, `**` as a whole component (any number of
//! folders, none included) and `{a,b}` alternatives. A pattern without '/' matches the file name
//! at any depth (as in .gitignore): `*.py` is `**/*.py`.

use anyhow::{bail, Result};

#[derive(Clone, Debug)]
pub struct Glob {
    /// One alternative per `{…}` expansion, each a list of path components.
    alternatives: Vec<Vec<String>>,
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob> {
        let p = pattern.trim_start_matches("./");
        if p.is_empty() {
            bail!("--glob {pattern:?}: empty pattern");
        }
        if p.starts_with('/') {
            bail!("--glob {pattern:?}: patterns are relative to each --input folder; drop the leading '/'");
        }
        let mut alternatives = vec![];
        for alt in expand_braces(p).map_err(|e| anyhow::anyhow!("--glob {pattern:?}: {e}"))? {
            let mut parts: Vec<String> = alt.split('/').filter(|s| !s.is_empty()).map(String::from).collect();
            if !alt.contains('/') {
                parts.insert(0, "**".into());
            }
            for part in &parts {
                check_classes(part).map_err(|e| anyhow::anyhow!("--glob {pattern:?}: {e}"))?;
            }
            alternatives.push(parts);
        }
        Ok(Glob { alternatives })
    }

    /// Whether a '/'-separated relative path matches.
    pub fn matches(&self, rel: &str) -> bool {
        let comps: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
        self.alternatives.iter().any(|parts| match_parts(parts, &comps))
    }
}

/// `a{b,c}d{e,f}` → abde, abdf, acde, acdf (nested braces allowed).
fn expand_braces(p: &str) -> std::result::Result<Vec<String>, String> {
    let chars: Vec<char> = p.chars().collect();
    let Some(open) = chars.iter().position(|&c| c == '{') else {
        if p.contains('}') {
            return Err("'}' without '{'".into());
        }
        return Ok(vec![p.to_string()]);
    };
    // The matching close brace, and the top-level commas between.
    let (mut depth, mut close, mut commas) = (0usize, None, vec![]);
    for (i, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(i),
            _ => {}
        }
    }
    let Some(close) = close else { return Err("'{' without '}'".into()) };
    let head: String = chars[..open].iter().collect();
    let tail: String = chars[close + 1..].iter().collect();
    let mut bounds = vec![open];
    bounds.extend(&commas);
    bounds.push(close);
    let mut out = vec![];
    for w in bounds.windows(2) {
        let mid: String = chars[w[0] + 1..w[1]].iter().collect();
        for e in expand_braces(&format!("{head}{mid}{tail}"))? {
            out.push(e);
        }
    }
    Ok(out)
}

fn check_classes(part: &str) -> std::result::Result<(), String> {
    let chars: Vec<char> = part.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '[' {
            match class_end(&chars, i) {
                Some(e) => i = e,
                None => return Err(format!("'[' without ']' in {part:?}")),
            }
        }
        i += 1;
    }
    Ok(())
}

/// Index of the ']' closing the class opened at `open` (a ']' right after '[' or '[!' is a member).
fn class_end(chars: &[char], open: usize) -> Option<usize> {
    let mut i = open + 1;
    if i < chars.len() && (chars[i] == '!' || chars[i] == '^') {
        i += 1;
    }
    if i < chars.len() && chars[i] == ']' {
        i += 1;
    }
    (i..chars.len()).find(|&j| chars[j] == ']')
}

fn match_parts(parts: &[String], comps: &[&str]) -> bool {
    match parts.first() {
        None => comps.is_empty(),
        Some(p) if p == "**" => (0..=comps.len()).any(|k| match_parts(&parts[1..], &comps[k..])),
        Some(p) => !comps.is_empty() && match_component(p, comps[0]) && match_parts(&parts[1..], &comps[1..]),
    }
}

/// One path component against one pattern component (no '/' in either).
fn match_component(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let s: Vec<char> = name.chars().collect();
    // Iterative matcher with one backtrack point for the last '*'.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        let step = if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, si));
                    pi += 1;
                    continue;
                }
                '?' => Some(pi + 1),
                '[' => match class_end(&p, pi) {
                    Some(end) if class_matches(&p[pi + 1..end], s[si]) => Some(end + 1),
                    Some(_) => None,
                    None => (p[pi] == s[si]).then_some(pi + 1),
                },
                c => (c == s[si]).then_some(pi + 1),
            }
        } else {
            None
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                si += 1;
            }
            (None, Some((sp, ss))) => {
                pi = sp + 1;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn class_matches(class: &[char], c: char) -> bool {
    let (neg, body) = match class.first() {
        Some('!') | Some('^') => (true, &class[1..]),
        _ => (false, class),
    };
    let mut hit = false;
    let mut i = 0;
    while i < body.len() {
        if i + 2 < body.len() && body[i + 1] == '-' {
            hit |= body[i] <= c && c <= body[i + 2];
            i += 3;
        } else {
            hit |= body[i] == c;
            i += 1;
        }
    }
    hit != neg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let g = |p: &str| Glob::new(p).unwrap();
        assert!(g("*.py").matches("a.py") && g("*.py").matches("pkg/sub/a.py"));
        assert!(!g("*.py").matches("a.pyc") && !g("*.py").matches("a.py/x"));
        assert!(g("**/*.py").matches("a.py") && g("**/*.py").matches("x/y/a.py"));
        assert!(g("pkg/*.py").matches("pkg/a.py") && !g("pkg/*.py").matches("pkg/sub/a.py"));
        assert!(g("pkg/**/a.py").matches("pkg/a.py") && g("pkg/**/a.py").matches("pkg/x/y/a.py"));
        assert!(g("**/*.{c,h,cpp}").matches("src/x.cpp") && g("*.{c,h}").matches("x.h"));
        assert!(!g("*.{c,h}").matches("x.cc"));
        assert!(g("a?c.[ch]").matches("abc.c") && !g("a?c.[ch]").matches("abc.o"));
        assert!(g("[!_]*.py").matches("a.py") && !g("[!_]*.py").matches("__init__.py"));
        assert!(g("[a-c]*").matches("b1") && !g("[a-c]*").matches("d1"));
        assert!(g("*a*b*").matches("xxaybzz") && !g("*a*b*").matches("xxbya"));
        assert!(g("./*.rs").matches("src/lib.rs"));
        for bad in ["", "/abs/*.py", "*.{c,h", "x}", "[ab"] {
            assert!(Glob::new(bad).is_err(), "{bad:?}");
        }
    }
}
