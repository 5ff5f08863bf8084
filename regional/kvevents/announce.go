package kvevents

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// HeaderAnnounceMAC carries, on a message holding a PodUp, the hex
// HMAC-SHA256 of the PodUp under the region's announce key (AnnounceMAC):
// where the controller is configured with a key, a PodUp without a valid
// one is not believed (its endpoint would receive prompts).
const HeaderAnnounceMAC = "meridian-announce-mac"

// AnnounceMAC is the hex HMAC-SHA256 of u's fields under key: the pod,
// endpoint, model, hardware, region and epoch, each length-prefixed, after
// a version label, so no two different announcements share an input; then
// the engine kind and KV capacity when either is set (so announcements
// without them keep the MAC they had, and neither can be added or changed
// without the key); then the TTL when set (likewise).
func AnnounceMAC(key []byte, u *PodUp) string {
	m := hmac.New(sha256.New, key)
	b := []byte("meridian-podup-v1")
	fields := []string{u.Pod, u.Endpoint, u.Model, u.Hardware, u.Region, strconv.FormatUint(u.Epoch, 10)}
	if u.Engine != "" || u.KVBlocks != 0 {
		fields = append(fields, u.Engine, strconv.FormatUint(u.KVBlocks, 10))
	}
	if u.TTL > 0 {
		fields = append(fields, "ttl_ms="+strconv.FormatInt(u.TTL.Milliseconds(), 10))
	}
	for _, f := range fields {
		b = strconv.AppendInt(append(b, 0), int64(len(f)), 10)
		b = append(append(b, ':'), f...)
	}
	m.Write(b)
	return hex.EncodeToString(m.Sum(nil))
}

// AnnounceMACValid reports, in constant time, whether mac is u's
// AnnounceMAC under key.
func AnnounceMACValid(key []byte, u *PodUp, mac string) bool {
	return hmac.Equal([]byte(AnnounceMAC(key, u)), []byte(mac))
}
