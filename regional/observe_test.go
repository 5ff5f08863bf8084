package regional

import (
	"reflect"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/regional/gossip"
)

// TestRegionViews: each observing region's view of another is the freshest
// report any of its controllers holds; a report beats none; nobody's view
// of its own region counts.
func TestRegionViews(t *testing.T) {
	now := time.Unix(1000, 0)
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	got := regionViews([]gossip.Sighting{
		// us-east-1's two replicas: the younger report wins, in either order.
		{Observer: "e-1", ObserverRegion: "us-east-1", Region: "eu-west-1", Pods: 2, Age: 20 * time.Second, ReceivedAt: at(time.Second)},
		{Observer: "e-2", ObserverRegion: "us-east-1", Region: "eu-west-1", Pods: 0, Age: time.Second, ReceivedAt: at(time.Second)},
		{Observer: "e-3", ObserverRegion: "us-east-1", Region: "eu-west-1", Pods: 3, Age: 30 * time.Second, ReceivedAt: now},
		// us-west-2: one replica holds nothing, the other a report.
		{Observer: "w-1", ObserverRegion: "us-west-2", Region: "eu-west-1", Pods: 2, Age: 4 * time.Second, ReceivedAt: at(6 * time.Second)},
		{Observer: "w-2", ObserverRegion: "us-west-2", Region: "eu-west-1", Pods: -1, ReceivedAt: now},
		// ap-southeast-1 holds nothing at all.
		{Observer: "a-1", ObserverRegion: "ap-southeast-1", Region: "eu-west-1", Pods: -1, ReceivedAt: now},
		// A region on itself: never a view.
		{Observer: "u-1", ObserverRegion: "eu-west-1", Region: "eu-west-1", Pods: 9, ReceivedAt: now},
		{Observer: "u-1", ObserverRegion: "eu-west-1", Region: "us-east-1", Pods: 1, Age: time.Second, ReceivedAt: now},
	}, now)
	want := map[string]map[string]global.PeerView{
		"eu-west-1": {
			"us-east-1":      {HealthyPods: 0, ReportAge: 2 * time.Second},
			"us-west-2":      {HealthyPods: 2, ReportAge: 10 * time.Second},
			"ap-southeast-1": {HealthyPods: -1},
		},
		"us-east-1": {"eu-west-1": {HealthyPods: 1, ReportAge: time.Second}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}
