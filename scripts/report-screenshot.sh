#!/usr/bin/env bash
# The HTML report as a person sees it: renders a campaign's report.html in
# headless Chromium (Debian's `chromium` package) at a laptop's width,
# writes a screenshot beside it and fails when the page is wider than the
# window (a table or a plot cut off) or a plot draws its legend inside it.
#   bash scripts/report-screenshot.sh [REPORT.html] [WIDTH]
# Without a report it runs a small campaign (60 runs) and shoots its report.
set -euo pipefail
cd "$(dirname "$0")/.."
width=${2:-1280}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    echo "needs headless Chromium: apt-get install chromium" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
report=${1:-}
if [ -z "$report" ]; then
    cargo build --quiet -p nanhunt --bin nanhunt
    target/debug/nanhunt fuzz --runs 60 --seed 3 --quiet --out "$work/campaign" > /dev/null || test $? -eq 1
    report="$work/campaign/report.html"
fi
# A probe appended to a copy: the page's widths, written into the DOM.
probe="$work/probe.html"
cp "$report" "$probe"
cat >> "$probe" <<'JS'
<script>
const d = document.documentElement;
const legendInPlot = [...document.querySelectorAll('figure svg')].some(s => /run \d+ \(/.test(s.textContent));
document.body.insertAdjacentHTML('beforeend',
  `<pre id="probe">scroll ${d.scrollWidth} client ${d.clientWidth} legend-in-plot ${legendInPlot}</pre>`);
</script>
JS
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$width,900")
line=$("$browser" "${flags[@]}" --dump-dom "file://$probe" 2>/dev/null | grep -o 'scroll [0-9]* client [0-9]* legend-in-plot [a-z]*')
shot="${report%.html}.png"
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$width,2400" \
    --screenshot="$shot" "file://$report" 2>/dev/null || true
read -r _ scroll _ client _ inside <<< "$line"
echo "at $width px: page $scroll px wide in a $client px window; legend inside a plot: $inside"
echo "screenshot: $shot"
if [ "$scroll" -gt "$client" ] || [ "$inside" != false ]; then
    echo "the report does not fit its window" >&2
    exit 1
fi
