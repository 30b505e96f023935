#!/usr/bin/env bash
# Opens a `care analyze` report's index.html in headless Chromium, takes a screenshot, and checks
# that the page rendered: the PNG exists, has the requested size, and is not blank (enough
# non-white pixels, and the dimension colours of the charts present).
#
# Usage:
#   bash scripts/analyze-screenshot.sh [REPORT_DIR] [PNG]
#     REPORT_DIR  a report directory (default: a fresh report of cli/data/analyze_demo.jsonl
#                 in target/analyze-screenshot/report, built with `cargo run -p care-cli`)
#     PNG         output screenshot (default: target/analyze-screenshot/index.png)
#   SCREENSHOT_SIZE=1400,5000 (width,height in px) sets the window size.
#
# Needs: Chromium (Debian package `chromium`: apt-get install -y chromium) and python3 (the
# check reads the PNG with the standard library only). The page is opened from a file: URL
# with networking off, as a reader would open it offline; a page that needed the network
# would render blank here and fail the check.
set -euo pipefail
cd "$(dirname "$0")/.."

work=target/analyze-screenshot
mkdir -p "$work"
report=${1:-}
png=${2:-$work/index.png}
size=${SCREENSHOT_SIZE:-1400,5000}

if [ -z "$report" ]; then
    report=$work/report
    rm -rf "$report"
    cargo run -q -p care-cli -- analyze cli/data/analyze_demo.jsonl --out "$report" --no-progress
fi
[ -f "$report/index.html" ] || { echo "analyze-screenshot: no $report/index.html" >&2; exit 2; }

browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "analyze-screenshot: chromium not found (apt-get install -y chromium)" >&2; exit 2; }

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
rm -f "$png"
# --virtual-time-budget lets the page finish layout before the shot; no scripts run anyway.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --hide-scrollbars --virtual-time-budget=5000 \
    --window-size="$size" --screenshot="$png" \
    "file://$(realpath "$report/index.html")" >"$work/chromium.log" 2>&1 || {
    echo "analyze-screenshot: chromium failed (log: $work/chromium.log)" >&2
    tail -5 "$work/chromium.log" >&2
    exit 1
}

python3 - "$png" "$size" <<'PY'
import struct, sys, zlib

path, size = sys.argv[1], sys.argv[2]
want_w, want_h = (int(x) for x in size.split(","))
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, ihdr = 8, b"", None
while pos < len(data):
    (n,) = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        ihdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
w, h, depth, ctype = ihdr[0], ihdr[1], ihdr[2], ihdr[3]
assert (w, h) == (want_w, want_h), f"screenshot is {w}x{h}, asked for {want_w}x{want_h}"
assert depth == 8 and ctype in (2, 6), f"unexpected PNG format depth {depth} type {ctype}"
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
rows, prev = [], bytearray(stride)
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1:
            line[i] = (line[i] + a) & 255
        elif f == 2:
            line[i] = (line[i] + b) & 255
        elif f == 3:
            line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line))
    prev = line
ink, colours = 0, {}
dims = {"Cognitive": (0x00, 0x72, 0xB2), "Affective": (0xD5, 0x5E, 0x00), "Proactive": (0x00, 0x9E, 0x73)}
for row in rows:
    for x in range(0, stride, bpp):
        px = tuple(row[x:x + 3])
        if px != (255, 255, 255):
            ink += 1
        for name, c in dims.items():
            if px == c:
                colours[name] = colours.get(name, 0) + 1
share = ink / (w * h)
print(f"analyze-screenshot: {path}: {w}x{h}, {share:.1%} non-white, dimension pixels {colours}")
assert share > 0.05, "the page looks blank"
missing = [n for n in dims if colours.get(n, 0) < 200]
assert not missing, f"chart colours missing from the screenshot: {missing}"
PY
echo "analyze-screenshot: ok"
