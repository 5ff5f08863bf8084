package enginesim

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// metricValue sums the samples of a counter, gauge or histogram (its count)
// family in the engine's registry; 0 when absent.
func metricValue(t *testing.T, e *Engine, name string) float64 {
	t.Helper()
	fams, err := e.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				v += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return v
}
