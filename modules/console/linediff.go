package console

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A changed tool definition is shown whole, and above it what changed: a
// rug pull hides in one sentence of a long description or one member of a
// large schema, which two listings of a hundred lines side by side do not
// show. The definitions are the upstream's, so the comparison is bounded
// by the edits it finds, not by the definitions' size: the lines both
// share at their start and end are set aside, the rest is compared by
// Myers' algorithm (whose work grows with the lines times the edits), and
// a comparison that needs more than maxDiffEdits edits, or more steps than
// the page has left (diffBudget, for all its tools together), stops: the
// page says it did not compare them rather than showing every line as
// changed, where the one that matters would not stand out.

// A diffLine is one line of the comparison: kept, removed or added, or a
// run of kept lines left out.
type diffLine struct {
	Kind string // "keep", "del", "add" or "skip"
	Text string // the line; for "skip", how many lines are left out
	// Changed is where a removed line and the added line that replaces it
	// differ: Text[Changed[0]:Changed[1]], the rest shared by both. A
	// sentence appended to a description of a thousand characters is then
	// marked, not left for the reader to find. [0, len(Text)] for a line
	// with no counterpart.
	Changed [2]int
}

// Head, Mid and Tail are Text before, within and after Changed.
func (l diffLine) Head() string { return l.Text[:l.Changed[0]] }
func (l diffLine) Mid() string  { return l.Text[l.Changed[0]:l.Changed[1]] }
func (l diffLine) Tail() string { return l.Text[l.Changed[1]:] }

// Mark is the line's sign, for readers that do not see its colour.
func (l diffLine) Mark() string {
	switch l.Kind {
	case "del":
		return "-"
	case "add":
		return "+"
	}
	return " "
}

const (
	// maxDiffEdits bounds the lines removed and added one comparison
	// finds (its record of the search holds about maxDiffEdits² numbers).
	maxDiffEdits = 512
	// diffBudget bounds the steps of the comparisons of one page view,
	// all its changed tools together: a step is a comparison of two
	// lines' numbers or a number kept in the record of the search, so
	// that a page spends at most a few milliseconds and 16 MiB on them
	// however many tools changed, and however large their definitions.
	diffBudget = 4_000_000
	// diffContext is how many kept lines are shown around a change.
	diffContext = 3
)

// A differ compares the definitions of one page view within its budget.
type differ struct {
	steps int // left
}

func newDiffer() *differ { return &differ{steps: diffBudget} }

// lineDiff compares two texts line by line: nil and true when they are
// the same, nil and false when the comparison would take more edits or
// steps than it may.
func (df *differ) lineDiff(before, after string) ([]diffLine, bool) {
	if before == after {
		return nil, true
	}
	if df.steps <= 0 {
		return nil, false
	}
	a, b := strings.Split(before, "\n"), strings.Split(after, "\n")
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	middle, ok := df.myers(a[p:len(a)-s], b[p:len(b)-s])
	if !ok {
		return nil, false
	}
	var all []diffLine
	for _, l := range a[:p] {
		all = append(all, diffLine{Kind: "keep", Text: l})
	}
	all = append(all, middle...)
	for _, l := range a[len(a)-s:] {
		all = append(all, diffLine{Kind: "keep", Text: l})
	}
	markChanges(all)
	return withContext(all), true
}

// myers finds a shortest edit script from a to b (E. W. Myers, "An O(ND)
// difference algorithm and its variations", 1986), with the removals of
// each run of changes before its additions; false when it takes more than
// maxDiffEdits edits or the steps the differ has left.
func (df *differ) myers(a, b []string) ([]diffLine, bool) {
	// Lines are compared by number: two lines are equal when their
	// numbers are, whatever their length.
	ids := map[string]int32{}
	number := func(lines []string) []int32 {
		out := make([]int32, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = int32(len(ids))
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	x0, y0 := number(a), number(b)
	n, m := len(a), len(b)
	df.steps -= n + m
	limit := min(n+m, maxDiffEdits)
	// v[k+limit+1] is the furthest x reached on diagonal k (y = x - k);
	// trace[d] is v after d edits, on diagonals -d to d.
	v := make([]int32, 2*limit+3)
	var trace [][]int32
	end := -1
	for d := 0; d <= limit && end < 0; d++ {
		for k := -d; k <= d; k += 2 {
			i := k + limit + 1
			var x int32
			if k == -d || (k != d && v[i-1] < v[i+1]) {
				x = v[i+1] // down: b's next line added
			} else {
				x = v[i-1] + 1 // right: a's next line removed
			}
			y := x - int32(k)
			for int(x) < n && int(y) < m && x0[x] == y0[y] {
				x, y = x+1, y+1
				df.steps--
			}
			v[i] = x
			df.steps--
			if int(x) >= n && int(y) >= m {
				end = d
				break
			}
		}
		if df.steps -= 2*d + 1; df.steps < 0 { // the record kept below
			return nil, false
		}
		trace = append(trace, slices.Clone(v[limit+1-d:limit+2+d]))
	}
	if end < 0 {
		return nil, false
	}
	// Back from (n, m) to (0, 0), one edit and the diagonal before it at a
	// time.
	var out []diffLine
	x, y := n, m
	for d := end; d > 0; d-- {
		prev := trace[d-1] // diagonals -(d-1) to d-1
		at := func(k int) int { return int(prev[k+d-1]) }
		k := x - y
		down := k == -d || (k != d && at(k-1) < at(k+1))
		pk := k - 1
		if down {
			pk = k + 1
		}
		px := at(pk)
		py := px - pk
		sx := px + 1 // where the edit leads, the diagonal from there to (x, y)
		if down {
			sx = px
		}
		for ; x > sx; x, y = x-1, y-1 {
			out = append(out, diffLine{Kind: "keep", Text: a[x-1]})
		}
		if down {
			out = append(out, diffLine{Kind: "add", Text: b[py]})
		} else {
			out = append(out, diffLine{Kind: "del", Text: a[px]})
		}
		x, y = px, py
	}
	for ; x > 0; x-- {
		out = append(out, diffLine{Kind: "keep", Text: a[x-1]})
	}
	slices.Reverse(out)
	return removalsFirst(out), true
}

// removalsFirst orders each run of changed lines (no kept line between
// them) removals first, as diffs show them; the run means the same.
func removalsFirst(lines []diffLine) []diffLine {
	for i := 0; i < len(lines); {
		if lines[i].Kind == "keep" {
			i++
			continue
		}
		j := i
		for j < len(lines) && lines[j].Kind != "keep" {
			j++
		}
		removal := func(l diffLine) int {
			if l.Kind == "del" {
				return 0
			}
			return 1
		}
		slices.SortStableFunc(lines[i:j], func(p, q diffLine) int { return removal(p) - removal(q) })
		i = j
	}
	return lines
}

// markChanges sets each changed line's Changed: within a run of removed
// lines followed by as many added ones, the i-th removed and the i-th
// added line are each other's counterparts, and their common start and
// end are left unmarked; any other changed line is marked whole.
func markChanges(all []diffLine) {
	for i := range all {
		all[i].Changed = [2]int{0, len(all[i].Text)}
	}
	for i := 0; i < len(all); {
		d := i
		for d < len(all) && all[d].Kind == "del" {
			d++
		}
		n := d
		for n < len(all) && all[n].Kind == "add" {
			n++
		}
		if d > i && n-d == d-i {
			for k := range d - i {
				within(&all[i+k], &all[d+k])
			}
		}
		i = max(n, i+1)
	}
}

// within marks where a and b differ, between their common start and end,
// cut where both have a character start (a line that is not valid UTF-8
// is never cut inside a character of the other).
func within(a, b *diffLine) {
	x, y := a.Text, b.Text
	starts := func(s string, i int) bool { return i >= len(s) || utf8.RuneStart(s[i]) }
	p := 0
	for p < len(x) && p < len(y) && x[p] == y[p] {
		p++
	}
	for p > 0 && !(starts(x, p) && starts(y, p)) {
		p--
	}
	s := 0
	for s < len(x)-p && s < len(y)-p && x[len(x)-1-s] == y[len(y)-1-s] {
		s++
	}
	for s > 0 && !(starts(x, len(x)-s) && starts(y, len(y)-s)) {
		s--
	}
	a.Changed, b.Changed = [2]int{p, len(x) - s}, [2]int{p, len(y) - s}
}

// withContext leaves out the kept lines more than diffContext lines away
// from any change, each run of them as one "skip" line.
func withContext(all []diffLine) []diffLine {
	near := make([]bool, len(all))
	for i, l := range all {
		if l.Kind == "keep" {
			continue
		}
		for k := max(0, i-diffContext); k <= min(len(all)-1, i+diffContext); k++ {
			near[k] = true
		}
	}
	var out []diffLine
	for i := 0; i < len(all); {
		if near[i] {
			out = append(out, all[i])
			i++
			continue
		}
		n := 0
		for i < len(all) && !near[i] {
			i, n = i+1, n+1
		}
		text := "1 line unchanged"
		if n > 1 {
			text = strconv.Itoa(n) + " lines unchanged"
		}
		out = append(out, diffLine{Kind: "skip", Text: text})
	}
	return out
}
