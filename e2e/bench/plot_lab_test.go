package bench_test

import (
	"fmt"
	"math"
	"strings"
)

// The plot: three panels against the fleet size N (log scale when the sizes span more than a
// decade): time to Ready, the manager's memory, and its memory per guest cluster above its
// base; plain SVG, written here so that the bench needs no plotting library.

type series struct {
	name  string
	color string
	dash  bool
	y     func(Result) float64
}

const (
	panelW, panelH = 360, 260
	marginL        = 56
	marginT        = 56
	marginB        = 48
	gap            = 80
)

func plotSVG(results []Result, title string) string {
	var b strings.Builder
	width := marginL + 3*panelW + 2*gap + 24
	height := marginT + panelH + marginB + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", marginL, escape(title))
	panel(&b, results, marginL, "time to Ready (s)", []series{
		{name: "all ready", color: "#d62728", y: func(r Result) float64 { return r.AllReady }},
		{name: "p99", color: "#ff7f0e", y: func(r Result) float64 { return r.ReadyP99 }},
		{name: "p50", color: "#1f77b4", y: func(r Result) float64 { return r.ReadyP50 }},
		{name: "floor (all)", color: "#7f7f7f", dash: true, y: func(r Result) float64 {
			if r.Floor == nil {
				return math.NaN()
			}
			return r.Floor.FloorAll
		}},
	})
	panel(&b, results, marginL+panelW+gap, "manager memory (MiB)", []series{
		{name: "peak RSS", color: "#d62728", y: func(r Result) float64 { return r.PeakRSSMiB }},
		{name: "RSS", color: "#ff7f0e", y: func(r Result) float64 { return r.RSSMiB }},
		{name: "live heap", color: "#1f77b4", y: func(r Result) float64 { return r.HeapMiB }},
		{name: "target at N=1000", color: "#2ca02c", dash: true, y: func(Result) float64 { return 150 }},
	})
	panel(&b, results, marginL+2*(panelW+gap), "per guest cluster above the base (KiB)", []series{
		{name: "RSS", color: "#ff7f0e", y: func(r Result) float64 { return r.RSSPerClusterKiB }},
		{name: "anon RSS", color: "#9467bd", y: func(r Result) float64 { return r.AnonRSSPerClusterKiB }},
		{name: "live heap", color: "#1f77b4", y: func(r Result) float64 { return r.HeapPerClusterKiB }},
	})
	b.WriteString("</svg>\n")
	return b.String()
}

func panel(b *strings.Builder, results []Result, x0 int, label string, ss []series) {
	y0 := marginT
	ns := make([]float64, len(results))
	maxY := 0.0
	for i, r := range results {
		ns[i] = float64(r.N)
		for _, s := range ss {
			if v := s.y(r); !math.IsNaN(v) {
				maxY = math.Max(maxY, v)
			}
		}
	}
	minN, maxN := ns[0], ns[0]
	for _, n := range ns {
		minN, maxN = math.Min(minN, n), math.Max(maxN, n)
	}
	logX := maxN/minN > 10
	xOf := func(n float64) float64 {
		if maxN == minN {
			return float64(x0) + panelW/2
		}
		f := (n - minN) / (maxN - minN)
		if logX {
			f = math.Log(n/minN) / math.Log(maxN/minN)
		}
		return float64(x0) + 16 + f*(panelW-32)
	}
	top := niceCeil(maxY)
	yOf := func(v float64) float64 { return float64(y0+panelH) - v/top*panelH }

	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", x0, y0, panelW, panelH)
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		y := yOf(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+panelW, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, trim(v))
	}
	for _, n := range ns {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xOf(n), y0+panelH+16, trim(n))
	}
	xLabel := "guest clusters N"
	if logX {
		xLabel += " (log scale)"
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", x0+panelW/2, y0+panelH+34, xLabel)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+panelW/2, y0-8, escape(label))
	for k, s := range ss {
		var pts []string
		for i, r := range results {
			if v := s.y(r); !math.IsNaN(v) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(ns[i]), yOf(v)))
			}
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="5,4"`
		}
		if len(pts) > 0 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), s.color, dash)
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], s.color)
			}
		}
		ly := y0 + panelH + 50 + 0*k
		lx := x0 + k*(panelW/len(ss))
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly-4, lx+16, ly-4, s.color, dash)
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="10">%s</text>`+"\n", lx+20, ly, escape(s.name))
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trim(v float64) string { return strings.TrimSuffix(fmt.Sprintf("%.4g", v), ".0") }

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
