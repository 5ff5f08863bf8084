package residency

import (
	"fmt"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a policy file, at a precise position.
type Problem struct {
	File    string `json:"file"`
	Line    int    `json:"line"`   // 1-based
	Column  int    `json:"column"` // 1-based
	Value   string `json:"value"`  // the offending value as written ("" when a value is missing)
	Message string `json:"message"`
}

// String formats the problem as FILE:LINE:COL: message.
func (p Problem) String() string {
	return p.File + ":" + strconv.Itoa(p.Line) + ":" + strconv.Itoa(p.Column) + ": " + p.Message
}

// ValidationError is returned by Parse when a policy has problems; it lists
// every problem found, in file order.
type ValidationError struct {
	File     string
	Problems []Problem
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid residency policy %s: %d problem", e.File, len(e.Problems))
	if len(e.Problems) != 1 {
		b.WriteByte('s')
	}
	for _, p := range e.Problems {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}
