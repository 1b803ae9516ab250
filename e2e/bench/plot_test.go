package bench_test

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

// The plot is well-formed SVG with a line per series that has values (the floor's only when
// it was measured), for one size and for several.
func TestPlotSVG(t *testing.T) {
	for want, results := range map[int][]Result{
		10: {{N: 10, AllReady: 5, ReadyP50: 2, ReadyP99: 4, RSSMiB: 90, PeakRSSMiB: 95, HeapMiB: 16, RSSPerClusterKiB: 300}},
		11: {
			{N: 10, AllReady: 5, ReadyP50: 2, ReadyP99: 4, RSSMiB: 90, PeakRSSMiB: 95, HeapMiB: 16, Floor: &FloorResult{FloorAll: 2}},
			{N: 100, AllReady: 90, ReadyP50: 30, ReadyP99: 60, RSSMiB: 300, PeakRSSMiB: 320, HeapMiB: 120, Floor: &FloorResult{FloorAll: 20}},
			{N: 1000, AllReady: 900, ReadyP50: 300, ReadyP99: 600, RSSMiB: 900, PeakRSSMiB: 950, HeapMiB: 400},
		},
	} {
		svg := plotSVG(results, "a <title> & more")
		d := xml.NewDecoder(strings.NewReader(svg))
		lines := 0
		for {
			tok, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("not well-formed: %v\n%s", err, svg)
			}
			if e, ok := tok.(xml.StartElement); ok && e.Name.Local == "polyline" {
				lines++
			}
		}
		if lines != want {
			t.Errorf("%d polylines for %d sizes, want %d", lines, len(results), want)
		}
	}
}
