//! Number and text formatting shared by every report: significant-digit
//! rounding (reports are byte-stable) and HTML escaping.

/// `x` rounded to `digits` significant digits (NaN and ±inf kept).
pub fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let text = format!("{:.*e}", (digits - 1).max(0) as usize, x);
    text.parse().unwrap_or(x)
}

/// `s` safe inside HTML text and attribute values.
pub fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
