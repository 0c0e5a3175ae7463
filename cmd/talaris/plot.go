//go:build linux

package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// writePlots writes bench-latency-cdf.png, bench-rtt-cdf.png and
// bench-ingress-<transport>.png to dir and returns their paths.
func (b *bench) writePlots(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, wl := range []string{"latency", "rtt"} {
		f := filepath.Join(dir, "bench-"+wl+"-cdf.png")
		ok, err := b.plotCDF(wl, f)
		if err != nil {
			return files, err
		}
		if ok {
			files = append(files, f)
		}
	}
	for _, tr := range []string{"ws", "wss"} {
		f := filepath.Join(dir, "bench-ingress-"+tr+".png")
		ok, err := b.plotIngress(tr, f)
		if err != nil {
			return files, err
		}
		if ok {
			files = append(files, f)
		}
	}
	return files, nil
}

// palette has one distinct colour per client line or bar (plotutil's
// default repeats after seven).
var palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0xbc, 0xbd, 0x22, 0xff}, {0x1f, 0x77, 0xb4, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0x17, 0xbe, 0xcf, 0xff}, {0x7f, 0x7f, 0x7f, 0xff}, {0x00, 0x00, 0x00, 0xff},
}

func colorOf(i int) color.Color { return palette[i%len(palette)] }

// cdfX maps a percentile to the "nines" axis: 0 -> 0, 90 -> 1, 99 -> 2 ...
func cdfX(pct float64) float64 { return -math.Log10(1 - math.Min(pct, 99.9999)/100) }

func (b *bench) plotCDF(wl, file string) (bool, error) {
	p := plot.New()
	if wl == "latency" {
		p.Title.Text = fmt.Sprintf("one-way latency, %d msg/s, 64 B (loopback)", b.rate)
	} else {
		p.Title.Text = "echo round trip, 64 B, one outstanding (loopback)"
	}
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "microseconds (log)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Tick.Marker = plot.ConstantTicks{
		{Value: 0, Label: "0"}, {Value: cdfX(50), Label: "50"}, {Value: 1, Label: "90"}, {Value: 2, Label: "99"},
		{Value: 3, Label: "99.9"}, {Value: 4, Label: "99.99"}, {Value: 5, Label: "99.999"},
	}
	p.Legend.Top = true
	p.Legend.Left = true
	n := 0
	for _, r := range b.results {
		if r.Workload != wl || r.Err != "" || len(r.CDF) == 0 {
			continue
		}
		var xys plotter.XYs
		for _, pt := range r.CDF {
			if pt[0] >= 100 || pt[1] <= 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: cdfX(pt[0]), Y: pt[1]})
		}
		if r.Max > 0 && len(xys) > 0 {
			xys = append(xys, plotter.XY{X: xys[len(xys)-1].X + 0.3, Y: r.Max})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return false, err
		}
		l.Color = colorOf(n)
		l.Dashes = plotutil.Dashes(n / len(palette))
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Client, l)
		n++
	}
	if n == 0 {
		return false, nil
	}
	p.Add(plotter.NewGrid())
	return true, p.Save(9*vg.Inch, 5.5*vg.Inch, file)
}

func (b *bench) plotIngress(tr, file string) (bool, error) {
	var clients []string
	seen := map[string]bool{}
	var conns []int
	seenC := map[int]bool{}
	val := map[string]map[int]float64{}
	for _, r := range b.results {
		if r.Workload != "ingress" || r.Transport != tr || r.Err != "" {
			continue
		}
		if !seen[r.Client] {
			seen[r.Client] = true
			clients = append(clients, r.Client)
			val[r.Client] = map[int]float64{}
		}
		if !seenC[r.Conns] {
			seenC[r.Conns] = true
			conns = append(conns, r.Conns)
		}
		val[r.Client][r.Conns] = r.FramesPerSec / 1e6
	}
	if len(clients) == 0 {
		return false, nil
	}
	p := plot.New()
	size := 64
	if tr == "wss" {
		size = 256
	}
	p.Title.Text = fmt.Sprintf("%s ingress, %d B frames (loopback, feed server in another process)", tr, size)
	p.Y.Label.Text = "million frames / s"
	p.X.Label.Text = "connections"
	names := make([]string, len(conns))
	for i, c := range conns {
		names[i] = fmt.Sprint(c)
	}
	w := vg.Points(float64(min(14, 120/len(clients))))
	for i, c := range clients {
		vs := make(plotter.Values, len(conns))
		for j, n := range conns {
			vs[j] = val[c][n]
		}
		bc, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return false, err
		}
		bc.LineStyle.Width = 0
		bc.Color = colorOf(i)
		bc.Offset = w * vg.Length(float64(i)-float64(len(clients)-1)/2)
		p.Add(bc)
		p.Legend.Add(c, bc)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(40)
	p.Y.Min = 0
	top := 0.0
	for _, m := range val {
		for _, v := range m {
			top = math.Max(top, v)
		}
	}
	p.Y.Max = top * 1.45 // room for the legend
	p.NominalX(names...)
	p.Add(plotter.NewGrid())
	return true, p.Save(10*vg.Inch, 5.5*vg.Inch, file)
}
