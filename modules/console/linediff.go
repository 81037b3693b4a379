package console

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// A changed tool definition is shown whole, and above it what changed: a
// rug pull hides in one sentence of a long description or one member of a
// large schema, which two listings of a hundred lines side by side do not
// show. The definitions are the upstream's, so the comparison is bounded:
// the lines both share at their start and end are set aside first (a
// change is usually a few lines), and only a middle of at most
// maxDiffCells line pairs is compared line by line; a larger one is shown
// as all its old lines removed and all its new ones added, still true.

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
	// maxDiffCells bounds the line pairs compared (the table of their
	// common subsequence holds one int32 per pair: 1 MiB at most, per
	// changed tool on the page).
	maxDiffCells = 1 << 18
	// diffContext is how many kept lines are shown around a change.
	diffContext = 3
)

// lineDiff compares two texts line by line; nil when they are the same.
func lineDiff(before, after string) []diffLine {
	if before == after {
		return nil
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
	var all []diffLine
	for _, l := range a[:p] {
		all = append(all, diffLine{Kind: "keep", Text: l})
	}
	all = append(all, middleDiff(a[p:len(a)-s], b[p:len(b)-s])...)
	for _, l := range a[len(a)-s:] {
		all = append(all, diffLine{Kind: "keep", Text: l})
	}
	markChanges(all)
	return withContext(all)
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

// within marks where a and b differ, between their common start and end
// (cut at the start of a UTF-8 character).
func within(a, b *diffLine) {
	x, y := a.Text, b.Text
	p := 0
	for p < len(x) && p < len(y) && x[p] == y[p] {
		p++
	}
	for p > 0 && p < len(x) && !utf8.RuneStart(x[p]) {
		p--
	}
	s := 0
	for s < len(x)-p && s < len(y)-p && x[len(x)-1-s] == y[len(y)-1-s] {
		s++
	}
	for s > 0 && !utf8.RuneStart(x[len(x)-s]) {
		s--
	}
	a.Changed, b.Changed = [2]int{p, len(x) - s}, [2]int{p, len(y) - s}
}

// middleDiff compares a and b by their longest common subsequence of
// lines, when there are at most maxDiffCells pairs of them.
func middleDiff(a, b []string) []diffLine {
	var out []diffLine
	if len(a)*len(b) > maxDiffCells {
		for _, l := range a {
			out = append(out, diffLine{Kind: "del", Text: l})
		}
		for _, l := range b {
			out = append(out, diffLine{Kind: "add", Text: l})
		}
		return out
	}
	// common[i*w+j]: the longest common subsequence of a[i:] and b[j:].
	w := len(b) + 1
	common := make([]int32, (len(a)+1)*w)
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				common[i*w+j] = common[(i+1)*w+j+1] + 1
			} else {
				common[i*w+j] = max(common[(i+1)*w+j], common[i*w+j+1])
			}
		}
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			out = append(out, diffLine{Kind: "keep", Text: a[i]})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || common[(i+1)*w+j] >= common[i*w+j+1]):
			out = append(out, diffLine{Kind: "del", Text: a[i]}) // removals first, as diff shows them
			i++
		default:
			out = append(out, diffLine{Kind: "add", Text: b[j]})
			j++
		}
	}
	return out
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
