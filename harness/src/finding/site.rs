//! Where an op of a user's code is, as a finding carries it (owned,
//! serialized): the site `#[nanhunt::instrument]` records for each tensor
//! op it rewrites ([`Site`], a static per op in the user's binary).

use super::OpKind;
use crate::instrument::Site;
use serde::{Deserialize, Serialize};

/// An op's site as a finding carries it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpSite {
    /// The source file, as `file!()` gives it.
    pub file: String,
    /// The line.
    pub line: u32,
    /// The column.
    pub column: u32,
    /// The op's expression as written.
    pub text: String,
    /// Each operand's text as written, receiver first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operands: Vec<String>,
    /// The method, function or operator (`log`, `softmax`, `/`).
    pub op: String,
    /// The function it is in, with its type for a method (`Net::forward`).
    pub function: String,
    /// What the op computes.
    pub kind: OpKind,
    /// The name its statement binds its result to (`let h = x.exp()?;`):
    /// what a rewrite elsewhere in the function calls it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

impl OpSite {
    /// The site of `site`, in the function `owner::function` when the op
    /// is in a method (`owner` the type's name).
    pub fn of(site: &Site, owner: Option<&str>) -> OpSite {
        OpSite {
            file: site.file.to_string(),
            line: site.line,
            column: site.column,
            text: site.text.to_string(),
            operands: site.operands.iter().map(|s| s.to_string()).collect(),
            op: site.op.to_string(),
            function: match owner {
                Some(o) => format!("{o}::{}", site.function),
                None => site.function.to_string(),
            },
            kind: site.kind,
            binding: Some(site.binding)
                .filter(|b| !b.is_empty())
                .map(str::to_string),
        }
    }

    /// `file:line:column`.
    pub fn location(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.column)
    }

    /// The expression, shortened to `max` characters (an ellipsis in the
    /// middle) for one line of output.
    pub fn short_text(&self, max: usize) -> String {
        let chars: Vec<char> = self.text.chars().collect();
        if chars.len() <= max || max < 8 {
            return self.text.clone();
        }
        let head = (max - 1) / 2;
        let tail = max - 1 - head;
        let mut s: String = chars[..head].iter().collect();
        s.push('…');
        s.extend(&chars[chars.len() - tail..]);
        s
    }
}

impl std::fmt::Display for OpSite {
    /// `log `p.log()` at src/model.rs:42:17`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} `{}` at {}",
            self.kind,
            self.short_text(60),
            self.location()
        )
    }
}

/// The type's name without its path and generic arguments
/// (`my_crate::model::Block<f32>` → `Block`).
pub fn short_type_name(full: &str) -> &str {
    let bare = full.split('<').next().unwrap_or(full);
    bare.rsplit("::").next().unwrap_or(bare)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_lose_their_paths_and_arguments() {
        assert_eq!(short_type_name("a::b::Block<f32, c::D>"), "Block");
        assert_eq!(short_type_name("Net"), "Net");
    }

    #[test]
    fn long_expressions_are_shortened_in_the_middle() {
        let s = OpSite {
            file: "m.rs".into(),
            line: 3,
            column: 9,
            text: "a.exp()?.sum_keepdim(D::Minus1)?.log()".into(),
            operands: vec!["a.exp()?.sum_keepdim(D::Minus1)?".into()],
            op: "log".into(),
            function: "forward".into(),
            binding: None,
            kind: OpKind::Log,
        };
        assert_eq!(s.short_text(15), "a.exp()…?.log()");
        assert_eq!(s.location(), "m.rs:3:9");
    }
}
