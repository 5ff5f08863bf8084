package regional

import (
	"bytes"
	"encoding/json"
)

// ReportingXargs are the vllm_xargs keys that change what an engine
// reports in its KV events rather than what it computes. The proxy drops
// them from client requests before forwarding, so that no client can
// change the event stream the index is built from:
//
//   - kv_cache_report_mode: "full" makes vLLM re-announce every prefix
//     block a request reuses (vllm/v1/core/kv_cache_manager.py,
//     get_computed_blocks), including empty sliding-window and mamba
//     positions (vllm/v1/request.py reads it from the request's
//     extra_args, which vllm_xargs fills).
//
// Other keys (kv_transfer_params, ec_transfer_params, extensions' own) pass
// unchanged: they change what the engine does, which its events then
// report as they are.
var ReportingXargs = []string{"kv_cache_report_mode"}

// dropReportingXargs returns body without the ReportingXargs keys of its
// vllm_xargs object (and without vllm_xargs when nothing else is left in
// it). A body that names none of them, or is not a JSON object, is returned
// as it is; the common case, a body that has neither "xargs" nor a \u
// escape (which could spell it), is not parsed at all.
func dropReportingXargs(body []byte) []byte {
	if !bytes.Contains(body, []byte("xargs")) && !bytes.Contains(body, []byte(`\u`)) {
		return body
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body
	}
	raw, ok := top["vllm_xargs"]
	if !ok {
		return body
	}
	var xargs map[string]json.RawMessage
	if json.Unmarshal(raw, &xargs) != nil {
		return body
	}
	dropped := false
	for _, k := range ReportingXargs {
		if _, ok := xargs[k]; ok {
			delete(xargs, k)
			dropped = true
		}
	}
	if !dropped {
		return body
	}
	if len(xargs) == 0 {
		delete(top, "vllm_xargs")
	} else if top["vllm_xargs"], ok = marshalRaw(xargs); !ok {
		return body
	}
	out, ok := marshalRaw(top)
	if !ok {
		return body
	}
	return out
}

func marshalRaw(v map[string]json.RawMessage) (json.RawMessage, bool) {
	b, err := json.Marshal(v)
	return b, err == nil
}
