package regional

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// A request to a plain-http pod is serialized here, straight into the
// buffer it is written from, rather than built as an http.Request and
// written by its Write method: the request, its header map, its URL and
// Write's own formatting cost about 5% of the controller's CPU per
// proxied request. What goes over the wire is byte for byte what Write
// sends (TestAppendPostLikeWrite); requests it cannot write that way go
// through http.Request as before.

// headerField is one header of a request to a pod: its name as sent and
// its values.
type headerField struct {
	key    string
	values []string
}

// podTarget splits url, a pod's endpoint joined with the request's path,
// into the host:port to dial and the path, when appendPost writes a
// request to it as http.Request.Write would: plain http, an ASCII host
// with an explicit port, a path of unreserved characters.
func podTarget(url string) (host, path string, ok bool) {
	rest, ok := strings.CutPrefix(url, "http://")
	if !ok {
		return "", "", false
	}
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return "", "", false
	}
	host, path = rest[:i], rest[i:]
	for i := 0; i < len(host); i++ {
		if c := host[i]; !isAlnum(c) && c != '.' && c != '-' && c != ':' && c != '[' && c != ']' {
			return "", "", false
		}
	}
	for i := 0; i < len(path); i++ {
		if c := path[i]; !isAlnum(c) && c != '/' && c != '-' && c != '_' && c != '.' && c != '~' {
			return "", "", false
		}
	}
	if h, port, err := net.SplitHostPort(host); err != nil || h == "" || port == "" {
		return "", "", false
	}
	return host, path, true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// podFields appends to dst the header fields of a request relayed with
// in's fields that keep passes, then add's (which replace in's of the
// same name), sorted by name as http.Request.Write sends them.
func podFields(dst []headerField, in http.Header, keep func(string) bool, add http.Header) []headerField {
	for k, vs := range in {
		if _, replaced := add[k]; !replaced && keep(k) {
			dst = append(dst, headerField{k, vs})
		}
	}
	for k, vs := range add {
		dst = append(dst, headerField{k, vs})
	}
	slices.SortFunc(dst, func(a, b headerField) int { return strings.Compare(a.key, b.key) })
	return dst
}

// postExcluded are the fields http.Request.Write writes on its own terms
// (or not at all) rather than from the header.
var postExcluded = map[string]bool{"Host": true, "User-Agent": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// appendPost appends to dst what http.Request.Write writes for a POST of
// body to http://host+path with fields (sorted by name), and reports
// whether it could: false when a field's name or value is one the
// transport refuses to send (the transport then says why).
func appendPost(dst []byte, host, path string, fields []headerField, body []byte) ([]byte, bool) {
	ua, hasUA := "Go-http-client/1.1", false
	for _, f := range fields {
		if !httpguts.ValidHeaderFieldName(f.key) {
			return dst, false
		}
		for _, v := range f.values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return dst, false
			}
		}
		if f.key == "User-Agent" && !hasUA {
			hasUA, ua = true, ""
			if len(f.values) > 0 {
				ua = f.values[0]
			}
		}
	}
	dst = append(dst, "POST "...)
	dst = append(dst, path...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	dst = append(dst, "\r\n"...)
	if ua != "" { // trimmed after the test, as Write does
		dst = append(append(append(dst, "User-Agent: "...), trimLWS(ua)...), "\r\n"...)
	}
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n"...)
	for _, f := range fields {
		if postExcluded[f.key] {
			continue
		}
		for _, v := range f.values {
			dst = append(append(dst, f.key...), ": "...)
			dst = append(append(dst, trimLWS(v)...), "\r\n"...)
		}
	}
	dst = append(dst, "\r\n"...)
	return append(dst, body...), true
}

// trimLWS trims the spaces and tabs around a valid header value (one
// without CR or LF), as Write does.
func trimLWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
