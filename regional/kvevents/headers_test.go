package kvevents

import "testing"

func TestTopicFor(t *testing.T) {
	if got := TopicFor("us-east-1"); got != "meridian.kv-events.us-east-1" {
		t.Fatalf("TopicFor(us-east-1) = %q", got)
	}
}
