package global

import (
	"cmp"
	"slices"
	"strings"
)

// Voter placement. A region runs several controllers (replicas), every one
// a member of the Raft group; only a few of them vote. The leader places
// the voters so that losing any one controller, or a whole region, keeps a
// quorum wherever the number of regions allows it:
//
//   - three regions or more: at most Config.VotersPerRegion voters per
//     region (default 1), up to Config.Voters (3 or 5), always an odd
//     number; losing a region loses at most one voter of three;
//   - two regions: three voters, two in one region and one in the other:
//     the cluster survives losing any one controller, or the region with
//     one voter (no placement of an odd number of voters survives losing
//     either of two regions: that needs a third region);
//   - one region: up to Config.Voters voters among its replicas (two
//     replicas: one voter).
//
// A voter that stops answering for Config.VoterDownAfter is replaced: a
// caught-up member of its region if it has one, else of a region lacking a
// voter, is promoted first, and the old voter demoted in a later round
// (promote before demote, so the quorum never shrinks under the remaining
// voters). Current voters that are up keep their vote (no churn), the
// leader always does. planVoters is the pure decision; reconcile applies
// it.

// voterCandidate is one server of the Raft configuration as the placement
// sees it.
type voterCandidate struct {
	ID     string
	Region string // "" when its member record is unknown (never promoted)
	Voter  bool
	Leader bool
	// Up: answering the leader's health checks (not down for
	// VoterDownAfter); CaughtUp: applied within PromoteMaxLag of the
	// leader's commit index and hearing the leader, so it may be promoted
	// now.
	Up       bool
	CaughtUp bool
}

// voterPlan is one round of changes toward the wanted voters.
type voterPlan struct {
	Want    int      // the number of voters wanted
	Promote []string // non-voters to promote now
	Demote  []string // voters to demote now (only once nothing is promoted)
}

// perRegionCap is the voters one region may hold given how many regions
// the cluster spans.
func perRegionCap(regions, voters, perRegion int) int {
	switch {
	case regions >= 3:
		return perRegion
	case regions == 2:
		return max(perRegion, 2)
	}
	return voters
}

// planVoters decides the next changes of suffrage: voters is Config.Voters,
// perRegion Config.VotersPerRegion. A voter that is down holds its seat
// until a member that is up can take it (demoting it without a
// replacement would only shrink the group: three voters with one down
// still have a quorum, one voter has none to spare).
func planVoters(servers []voterCandidate, voters, perRegion int) voterPlan {
	keep := func(s voterCandidate) bool { return s.Region != "" && s.Voter && (s.Leader || s.Up) }
	promotable := func(s voterCandidate) bool { return s.Region != "" && !s.Voter && s.Up && s.CaughtUp }
	seat := func(s voterCandidate) bool { return s.Region != "" && s.Voter && !s.Leader && !s.Up }
	usable := map[string]int{}
	for _, s := range servers {
		if keep(s) || promotable(s) || seat(s) {
			usable[s.Region]++
		}
	}
	regionCap := perRegionCap(len(usable), voters, perRegion)
	capacity := 0
	for _, n := range usable {
		capacity += min(regionCap, n)
	}
	want := min(voters, capacity)
	if want%2 == 0 {
		want--
	}
	plan := voterPlan{Want: want}
	if want < 1 {
		return plan
	}

	// The leader, then the voters that are up (by region, id), within each
	// region's cap; then members that are up, filling the regions with the
	// fewest voters; then, for the seats still empty, the voters that are
	// down.
	order := slices.Clone(servers)
	slices.SortFunc(order, func(a, b voterCandidate) int {
		if a.Leader != b.Leader {
			if a.Leader {
				return -1
			}
			return 1
		}
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.ID, b.ID))
	})
	chosen := map[string]bool{}
	inRegion := map[string]int{}
	take := func(s voterCandidate) {
		chosen[s.ID] = true
		inRegion[s.Region]++
	}
	for _, s := range order {
		if len(chosen) < want && keep(s) && inRegion[s.Region] < regionCap {
			take(s)
		}
	}
	regions := make([]string, 0, len(usable))
	for r := range usable {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	fill := func(ok func(voterCandidate) bool) {
		for len(chosen) < want {
			best := ""
			var pick voterCandidate
			for _, r := range regions {
				if inRegion[r] >= regionCap || (best != "" && inRegion[r] >= inRegion[best]) {
					continue
				}
				for _, s := range order {
					if s.Region == r && !chosen[s.ID] && ok(s) {
						best, pick = r, s
						break
					}
				}
			}
			if best == "" {
				return
			}
			take(pick)
		}
	}
	fill(promotable)
	fill(seat)
	for _, s := range order {
		switch {
		case chosen[s.ID] && !s.Voter:
			plan.Promote = append(plan.Promote, s.ID)
		case !chosen[s.ID] && s.Voter && !s.Leader:
			plan.Demote = append(plan.Demote, s.ID)
		}
	}
	if len(plan.Promote) > 0 {
		plan.Demote = nil // the next round, once the new voters vote
	}
	return plan
}
