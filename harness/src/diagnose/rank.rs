//! How causes are ranked: a verified fix first (a repair of the code before
//! a workaround that removes the trigger), then how well the cause's
//! evidence meets the failure ([`Relevance`]), then the article's order.
//! A cause with neither a verified fix nor evidence at the failure's site
//! never leads the list, however little else there is.

use super::Cause;

/// How well a cause explains a finding: typed, so that each cause says
/// *why* it fits (at the failure's site, or only as a suspect), and the
/// points that order causes of the same kind of fit live here alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Relevance {
    /// Nothing ties the cause to this failure.
    Unrelated,
    /// A suspect: nothing at the failure's site points at it; the number
    /// (below 50) orders suspects.
    Suspect(u8),
    /// Evidence at the failure's site: the phase, the op kind or the
    /// stage the failure is at is what the cause acts on; the number
    /// (0 to 49) orders causes at the site.
    AtSite(u8),
}

/// The points from which a cause counts as supported at the failure's site.
pub const SUPPORTED: i32 = 50;

/// A verified fix is worth this much more than any relevance.
pub const VERIFIED: i32 = 100;

impl Relevance {
    pub fn points(self) -> i32 {
        match self {
            Relevance::Unrelated => 0,
            Relevance::Suspect(n) => i32::from(n.min(49)),
            Relevance::AtSite(n) => SUPPORTED + i32::from(n.min(49)),
        }
    }

    /// The score of a cause with this relevance: verified fixes first.
    pub fn score(self, verified: bool) -> i32 {
        self.points() + if verified { VERIFIED } else { 0 }
    }

    /// Whether the cause's evidence points at the failure's site.
    pub fn at_site(self) -> bool {
        matches!(self, Relevance::AtSite(_))
    }
}

/// Best explanation first: causes with a verified fix or evidence at the
/// failure's site (a score of at least [`SUPPORTED`]) before the rest, then
/// a repair of the code before a workaround, then a fix with which the
/// failing step passed (a scene's), then by score, then by the article's
/// order. Returns how many lead the list
/// supported.
pub fn rank(causes: &mut [Cause]) -> usize {
    let supported = |c: &Cause| c.verified() || c.passes_step() || c.score >= SUPPORTED;
    causes.sort_by(|a, b| {
        supported(b)
            .cmp(&supported(a))
            .then(b.repaired().cmp(&a.repaired()))
            .then(b.passes_step().cmp(&a.passes_step()))
            .then(b.score.cmp(&a.score))
            .then(a.article_step.cmp(&b.article_step))
    });
    causes.iter().take_while(|c| supported(c)).count()
}
