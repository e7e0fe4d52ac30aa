"""The validation suite's pictures, written next to its table (validation/run): the collectives'
bus bandwidth against message size (bench-comm's tables, one line per collective) and the
throughput's weak scaling (tokens/s against ranks, with the ideal line through one node). Plain
SVG from a small line-chart writer here: no plotting library on the machines being accepted."""
import math
from xml.sax.saxutils import escape

W, H, L, R, T, B = 640, 400, 70, 150, 40, 50  # picture size and margins (the legend on the right)
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def _ticks(lo, hi, log):
    if log:
        return [2.0 ** k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-12)))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= 6:
            step *= m
            break
    return [step * k for k in range(math.floor(lo / step), math.ceil(hi / step) + 1)]


def _label(v):
    if v >= 1 << 20 and v == int(v) and int(v) % (1 << 20) == 0:
        return f"{int(v) >> 20}M"
    if v >= 1 << 10 and v == int(v) and int(v) % (1 << 10) == 0:
        return f"{int(v) >> 10}K"
    return f"{v:g}"


def line_chart(path, title, xlabel, ylabel, series, logx=False, dashed=()):
    """series: [(name, [(x, y), ...]), ...]; names in `dashed` are drawn dashed. Writes path."""
    pts = [p for _, s in series for p in s if (p[0] > 0 or not logx)]
    if not pts:
        return False
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = (x0 / 2, x1 * 2) if logx else (x0 - 1, x1 + 1)
    y0, y1 = 0.0, max(ys) * 1.1 or 1.0
    fx = (lambda x: math.log2(x)) if logx else (lambda x: x)
    px = lambda x: L + (fx(x) - fx(x0)) / (fx(x1) - fx(x0)) * (W - L - R)
    py = lambda y: H - B - (y - y0) / (y1 - y0) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2:.0f}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for v in _ticks(x0, x1, logx):
        if x0 <= v <= x1:
            out.append(f'<line x1="{px(v):.1f}" y1="{H - B}" x2="{px(v):.1f}" y2="{H - B + 5}" stroke="black"/>'
                       f'<text x="{px(v):.1f}" y="{H - B + 18}" text-anchor="middle">{_label(v)}</text>')
    for v in _ticks(y0, y1, False):
        if y0 <= v <= y1:
            out.append(f'<line x1="{L - 5}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#ddd"/>'
                       f'<text x="{L - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<text x="{(L + W - R) / 2:.0f}" y="{H - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(16,{(T + H - B) / 2:.0f}) rotate(-90)" text-anchor="middle">'
               f'{escape(ylabel)}</text>')
    for i, (name, s) in enumerate(series):
        c, dash = COLORS[i % len(COLORS)], ' stroke-dasharray="6,4"' if name in dashed else ""
        s = sorted(p for p in s if p[0] > 0 or not logx)
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>' for x, y in s]
        ly = T + 16 * i + 8
        out.append(f'<line x1="{W - R + 12}" y1="{ly}" x2="{W - R + 32}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/>'
                   f'<text x="{W - R + 38}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return True


def write(workdir, cache, system):
    """The pictures the run's checks left data for (cache: bench_tables, scaling); their paths."""
    done = []
    tables = cache.get("bench_tables")
    if tables:
        path = f"{workdir}/bandwidth.svg"
        series = [(op, [(r["size"], r["busbw"]) for r in rows]) for op, rows in tables.items() if rows]
        if line_chart(path, f"dtrain bench-comm on {system}: bus bandwidth", "message size (bytes)",
                      "busbw (GB/s)", series, logx=True):
            done.append(path)
    pts = cache.get("scaling")
    if pts:
        path = f"{workdir}/scaling.svg"
        r1, t1 = min(pts)
        ideal = [(r, t1 * r / r1) for r, _ in sorted(pts)]
        if line_chart(path, f"dtrain weak scaling on {system}", "ranks", "tokens/s",
                      [("measured", sorted(pts)), ("ideal (1 node x nodes)", ideal)], dashed=("ideal (1 node x nodes)",)):
            done.append(path)
    return done
