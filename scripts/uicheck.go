//go:build ignore

// Command uicheck checks a page as headless Chromium rendered it (the DOM
// of `chromium --headless --dump-dom`, after the page's scripts ran), for
// scripts/ui-check. It prints what it found and exits 1 on any problem.
//
//	go run ./scripts/uicheck.go console DOM [min-regions]
//	go run ./scripts/uicheck.go report DOM SOURCE.html
//	go run ./scripts/uicheck.go width DOM
//
// console: the controller console rendered its state at least once with
// no error, fits its window (no horizontal scroll: the page writes its
// scrollWidth and clientWidth on <body>), has a row per region and pod,
// Raft and gossip health, residency compliance, a failover event and
// recent decisions, and each of its three charts draws a line.
// report: the simulator's HTML report rendered every chart of its source,
// each with axes. width: a page that records its width on <body> (the
// demo's status page) rendered and needs no horizontal scrolling.
package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/net/html"
)

var problems []string

func bad(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func find(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && match(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func byID(root *html.Node, id string) *html.Node {
	if f := find(root, func(n *html.Node) bool { return attr(n, "id") == id }); len(f) > 0 {
		return f[0]
	}
	bad("no element #%s", id)
	return &html.Node{}
}

func tag(name string) func(*html.Node) bool { return func(n *html.Node) bool { return n.Data == name } }

func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.TrimSpace(b.String())
}

// rows are the body rows of table #id, each as its cells' texts.
func rows(root *html.Node, id string) [][]string {
	var out [][]string
	for _, tb := range find(byID(root, id), tag("tbody")) {
		for _, tr := range find(tb, tag("tr")) {
			var cells []string
			for _, td := range find(tr, tag("td")) {
				cells = append(cells, text(td))
			}
			out = append(out, cells)
		}
	}
	return out
}

func parse(path string) *html.Node {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer f.Close()
	doc, err := html.Parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return doc
}

// linePoints counts the points of the drawn lines of chart #id.
func linePoints(root *html.Node, id string) int {
	n := 0
	for _, p := range find(byID(root, id), func(n *html.Node) bool { return n.Data == "path" && attr(n, "class") == "series" }) {
		n += strings.Count(attr(p, "d"), "M") + strings.Count(attr(p, "d"), "L")
	}
	return n
}

func console(doc *html.Node, minRegions int) {
	body := find(doc, tag("body"))[0]
	renders, _ := strconv.Atoi(attr(body, "data-rendered"))
	sw, _ := strconv.Atoi(attr(body, "data-scroll-width"))
	cw, _ := strconv.Atoi(attr(body, "data-client-width"))
	fmt.Printf("rendered %d times; scrollWidth %d, clientWidth %d\n", renders, sw, cw)
	if renders < 1 {
		bad("the console never rendered its state")
	}
	if cw == 0 || sw > cw {
		bad("the page is %d px wide in a %d px window: horizontal scrolling", sw, cw)
	}
	if e := text(byID(doc, "err")); e != "" {
		bad("the page shows an error: %s", e)
	}
	if s := attr(byID(doc, "login"), "style"); !strings.Contains(s, "none") {
		bad("the page still asks for the token (login %q)", s)
	}
	fmt.Printf("header: %s | %s\n", text(byID(doc, "who")), text(byID(doc, "chips")))
	regions := rows(doc, "regions")
	fmt.Printf("regions: %d rows\n", len(regions))
	for _, r := range regions {
		fmt.Printf("  %s\n", strings.Join(r, " | "))
	}
	if len(regions) < minRegions {
		bad("%d region rows, want %d", len(regions), minRegions)
	}
	pods := rows(doc, "pods")
	fmt.Printf("pods: %d rows\n", len(pods))
	if len(pods) < 1 || len(pods[0]) < 11 {
		bad("no pod rows")
	}
	for _, p := range pods {
		fmt.Printf("  %s\n", strings.Join(p, " | "))
	}
	decisions := rows(doc, "decisions")
	fmt.Printf("decisions: %d rows\n", len(decisions))
	if len(decisions) < 1 || len(decisions[0]) < 9 {
		bad("no recent decision rows")
	}
	health := text(byID(doc, "health"))
	fmt.Printf("health: %s\n", health)
	if !strings.Contains(health, "Leader") && !strings.Contains(health, "Follower") {
		bad("no Raft state in the health panel")
	}
	if !strings.Contains(health, "alive") {
		bad("no gossip liveness in the health panel")
	}
	res := text(byID(doc, "residency"))
	fmt.Printf("residency: %s\n", res)
	if !strings.Contains(res, "by rule") || !strings.Contains(res, "violations caught") {
		bad("the residency panel lacks crossings by rule or violations")
	}
	fo := find(byID(doc, "failovers"), tag("li"))
	fmt.Printf("failover events: %d\n", len(fo))
	for _, li := range fo {
		fmt.Printf("  %s\n", text(li))
	}
	if len(fo) < 1 || strings.Contains(text(fo[0]), "no region state change") {
		bad("no failover event shown")
	}
	for _, id := range []string{"c-rate", "c-hit", "c-ttft"} {
		n := linePoints(doc, id)
		ticks := len(find(byID(doc, id), tag("text")))
		fmt.Printf("chart #%s: %d line points, %d axis labels\n", id, n, ticks)
		if n < 2 {
			bad("chart #%s draws no line", id)
		}
		if ticks < 6 {
			bad("chart #%s has no axis labels", id)
		}
	}
}

// width: a page that records its width on <body> (as the console does)
// rendered and fits its window.
func width(doc *html.Node) {
	body := find(doc, tag("body"))[0]
	renders, _ := strconv.Atoi(attr(body, "data-rendered"))
	sw, _ := strconv.Atoi(attr(body, "data-scroll-width"))
	cw, _ := strconv.Atoi(attr(body, "data-client-width"))
	fmt.Printf("rendered %d times; scrollWidth %d, clientWidth %d\n", renders, sw, cw)
	if renders < 1 {
		bad("the page never rendered")
	}
	if cw == 0 || sw > cw {
		bad("the page is %d px wide in a %d px window: horizontal scrolling", sw, cw)
	}
}

func report(doc *html.Node, source string) {
	b, err := os.ReadFile(source)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	want := len(regexp.MustCompile(`<svg`).FindAll(b, -1))
	svgs := find(doc, tag("svg"))
	fmt.Printf("report: %d charts rendered, %d in the file\n", len(svgs), want)
	if len(svgs) == 0 || len(svgs) != want {
		bad("%d charts rendered, want %d", len(svgs), want)
	}
	for i, s := range svgs {
		if len(find(s, tag("line"))) < 4 || len(find(s, tag("text"))) < 4 {
			bad("chart %d has no axes", i)
		}
	}
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: uicheck console DOM [min-regions] | uicheck report DOM SOURCE | uicheck width DOM")
		os.Exit(2)
	}
	doc := parse(os.Args[2])
	switch os.Args[1] {
	case "console":
		min := 1
		if len(os.Args) > 3 {
			min, _ = strconv.Atoi(os.Args[3])
		}
		console(doc, min)
	case "width":
		width(doc)
	case "report":
		if len(os.Args) < 4 {
			fmt.Fprintln(os.Stderr, "usage: uicheck report DOM SOURCE")
			os.Exit(2)
		}
		report(doc, os.Args[3])
	default:
		fmt.Fprintln(os.Stderr, "unknown check", os.Args[1])
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println("FAIL:", p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
	fmt.Println("ok")
}
