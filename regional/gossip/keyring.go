package gossip

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/memberlist"
)

// Keyring rotation, as Consul does it: an operation (install, use, remove,
// or a listing) is applied to this controller's keyring and then sent over
// the pool itself (SendReliable, encrypted with the current primary key) to
// every controller memberlist does not consider dead; each applies it
// (idempotently: installing an installed key, using the primary, removing
// an absent key change nothing, and a repeated operation id is answered,
// not re-applied) and answers with the outcome and its key fingerprints.
// The caller gets one result per controller. A controller that was down
// misses the operation: run it again once it is back (every step is
// idempotent), and set KeyringFile so a restart keeps the keyring.
//
// A rotation is three operations, each checked on every controller before
// the next:
//
//  1. InstallKey(new): every controller decrypts with it, none encrypts.
//  2. UseKey(new): every controller encrypts with it.
//  3. RemoveKey(old).
//
// Keys never appear in results, logs or metrics: only fingerprints (the
// first 16 hex digits of the key's SHA-256).

// KeyOp names a keyring operation.
type KeyOp string

// The keyring operations.
const (
	KeyList    KeyOp = "list"
	KeyInstall KeyOp = "install"
	KeyUse     KeyOp = "use"
	KeyRemove  KeyOp = "remove"
)

var keyOpCodes = map[KeyOp]keyOpCode{KeyList: keyOpList, KeyInstall: keyOpInstall, KeyUse: keyOpUse, KeyRemove: keyOpRemove}

func (c keyOpCode) op() KeyOp {
	for op, code := range keyOpCodes {
		if code == c {
			return op
		}
	}
	return KeyOp(fmt.Sprintf("op-%d", c))
}

// Errors of key operations.
var (
	// ErrInvalidKey: not base64 of KeyBytes bytes.
	ErrInvalidKey = errors.New("invalid gossip key")
	// ErrKeyRefused: this controller refused the operation (using a key it
	// does not hold, removing its primary key); nothing was sent.
	ErrKeyRefused = errors.New("key operation refused")
)

// KeyOpResult is the outcome of a key operation on every controller.
type KeyOpResult struct {
	Op KeyOp `json:"op"`
	// Fingerprint of the key operated on ("" for a listing).
	Fingerprint string `json:"fingerprint,omitempty"`
	// Nodes: this controller first, then the others by name.
	Nodes []KeyNodeResult `json:"nodes"`
	// Failed counts the controllers that refused or did not answer.
	Failed int `json:"failed"`
}

// KeyNodeResult is one controller's answer.
type KeyNodeResult struct {
	Node string `json:"node"`
	OK   bool   `json:"ok"`
	// Error says why not (refused, unreachable, no answer in time).
	Error string `json:"error,omitempty"`
	// Keys are the controller's key fingerprints after the operation,
	// primary first.
	Keys []string `json:"keys,omitempty"`
}

// KeyOpError is returned when some controllers refused or did not answer;
// the operation stays applied where it was.
type KeyOpError struct{ Result KeyOpResult }

func (e *KeyOpError) Error() string {
	var names []string
	for _, n := range e.Result.Nodes {
		if !n.OK {
			names = append(names, n.Node+": "+n.Error)
		}
	}
	return fmt.Sprintf("gossip key %s: %d of %d controllers failed (%s)", e.Result.Op, e.Result.Failed, len(e.Result.Nodes), strings.Join(names, "; "))
}

// KeyFingerprint is the fingerprint of a base64 gossip key, as ListKeys
// and key operation results show it.
func KeyFingerprint(key string) (string, error) {
	b, err := decodeKey(key)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	return fingerprint(b), nil
}

func fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// ListKeys returns the fingerprints of this controller's keys, primary
// first.
func (n *Node) ListKeys() []string {
	keys := n.keyring.GetKeys()
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fingerprint(k)
	}
	return out
}

// InstallKey adds key (base64, KeyBytes bytes) to every controller's
// keyring, for decryption only. It returns a *KeyOpError if a controller
// refused or did not answer within KeyOpTimeout.
func (n *Node) InstallKey(key string) error { return n.keyOpTimeout(KeyInstall, key) }

// UseKey makes key, which every controller must have installed, the one
// every controller encrypts with.
func (n *Node) UseKey(key string) error { return n.keyOpTimeout(KeyUse, key) }

// RemoveKey drops key from every controller's keyring. The primary key
// cannot be removed (use another first).
func (n *Node) RemoveKey(key string) error { return n.keyOpTimeout(KeyRemove, key) }

func (n *Node) keyOpTimeout(op KeyOp, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.KeyOpTimeout)
	defer cancel()
	_, err := n.KeyOperation(ctx, op, key)
	return err
}

// PoolKeys lists the key fingerprints of every controller.
func (n *Node) PoolKeys(ctx context.Context) (KeyOpResult, error) {
	return n.KeyOperation(ctx, KeyList, "")
}

// KeyOperation applies op to this controller's keyring and, if that
// succeeded, to every other live controller's, and reports each outcome;
// ctx bounds the wait for answers. Errors: ErrInvalidKey, ErrKeyRefused
// (nothing sent), *KeyOpError (some controllers failed), ErrClosed.
func (n *Node) KeyOperation(ctx context.Context, op KeyOp, key string) (KeyOpResult, error) {
	res := KeyOpResult{Op: op}
	code, ok := keyOpCodes[op]
	if !ok {
		return res, fmt.Errorf("%w: unknown operation %q", ErrKeyRefused, op)
	}
	if n.closed.Load() {
		return res, ErrClosed
	}
	var kb []byte
	if op != KeyList {
		var err error
		if kb, err = decodeKey(key); err != nil {
			return res, fmt.Errorf("gossip key %s: %w: %v", op, ErrInvalidKey, err)
		}
		res.Fingerprint = fingerprint(kb)
	}
	n.keyMu.Lock()
	err := n.applyKeyOpLocked(code, kb)
	n.keyMu.Unlock()
	n.m.keyOps.WithLabelValues(string(op), resultLabel(err)).Inc()
	if err != nil {
		return res, fmt.Errorf("gossip key %s %s: %w: %v", op, res.Fingerprint, ErrKeyRefused, err)
	}
	if op != KeyList {
		n.log.Info("gossip keyring changed here; sending to the pool", "op", op, "key", res.Fingerprint)
	}
	res.Nodes = append(res.Nodes, KeyNodeResult{Node: n.cfg.NodeName, OK: true, Keys: n.ListKeys()})

	peers := n.livePeers()
	id := randomID()
	acks := make(chan keyAckMsg, len(peers))
	failed := make(chan KeyNodeResult, len(peers))
	n.mu.Lock()
	n.keyWaits[id] = acks
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.keyWaits, id)
		n.mu.Unlock()
	}()
	msg := keyOpMsg{Op: code, ID: id, From: n.cfg.NodeName, Key: kb}.encode()
	pending := map[string]bool{}
	for _, p := range peers {
		pending[p.Name] = true
		n.keySends.Add(1)
		go func() {
			defer n.keySends.Done()
			if err := n.ml.SendReliable(&p, msg); err != nil {
				failed <- KeyNodeResult{Node: p.Name, Error: "not reached: " + err.Error()}
			}
		}()
	}
	var others []KeyNodeResult
	for len(pending) > 0 {
		select {
		case a := <-acks:
			if !pending[a.From] {
				continue
			}
			delete(pending, a.From)
			others = append(others, KeyNodeResult{Node: a.From, OK: a.Err == "", Error: a.Err, Keys: a.Keys})
		case f := <-failed:
			if pending[f.Node] {
				delete(pending, f.Node)
				others = append(others, f)
			}
		case <-ctx.Done():
			for name := range pending {
				others = append(others, KeyNodeResult{Node: name, Error: "no answer in time"})
			}
			clear(pending)
		}
	}
	slices.SortFunc(others, func(a, b KeyNodeResult) int { return strings.Compare(a.Node, b.Node) })
	res.Nodes = append(res.Nodes, others...)
	for _, r := range res.Nodes {
		if !r.OK {
			res.Failed++
		}
	}
	if res.Failed > 0 {
		return res, &KeyOpError{Result: res}
	}
	return res, nil
}

// checkKeyOp returns the error KeyOperation would refuse op on key with
// here, without changing anything: using a key this controller does not
// hold, removing its primary key, a closed node. A nil answer does not
// promise the operation succeeds (the keyring may change in between).
func (n *Node) checkKeyOp(op KeyOp, key []byte) error {
	if n.closed.Load() {
		return ErrClosed
	}
	keys := n.keyring.GetKeys()
	var why string
	switch op {
	case KeyUse:
		if !slices.ContainsFunc(keys, func(k []byte) bool { return bytes.Equal(k, key) }) {
			why = "the key is not installed here: install it first"
		}
	case KeyRemove:
		if len(keys) > 0 && bytes.Equal(keys[0], key) {
			why = "the primary key cannot be removed: use another key first"
		}
	}
	if why != "" {
		return fmt.Errorf("gossip key %s %s: %w: %s", op, fingerprint(key), ErrKeyRefused, why)
	}
	return nil
}

// livePeers are the other controllers not known dead, from the node's own
// table (memberlist mutates the *Node values Members returns under its own
// lock, so they are not read here).
func (n *Node) livePeers() []memberlist.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []memberlist.Node
	for _, p := range n.peers {
		if p.dead || p.node.Name == "" {
			continue
		}
		out = append(out, memberlist.Node{Name: p.node.Name, Addr: append([]byte(nil), p.node.Addr...), Port: p.node.Port})
	}
	return out
}

func randomID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func resultLabel(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// applyKeyOpLocked changes the keyring (n.keyMu held) and persists it.
func (n *Node) applyKeyOpLocked(op keyOpCode, key []byte) error {
	before := n.ListKeys()
	var err error
	switch op {
	case keyOpList:
		return nil
	case keyOpInstall:
		err = n.keyring.AddKey(key)
	case keyOpUse:
		err = n.keyring.UseKey(key)
	case keyOpRemove:
		err = removeKey(n.keyring, key)
	}
	if err != nil {
		return err
	}
	if slices.Equal(before, n.ListKeys()) {
		return nil
	}
	if err := n.persistKeyring(); err != nil {
		return fmt.Errorf("applied, but not persisted: %w", err)
	}
	return nil
}

// removeKey drops key from kr. memberlist's Keyring.RemoveKey shifts the
// keys after the removed one within the slice that the transport may be
// iterating to decrypt a packet (a data race); removing from the end
// moves nothing, so the keys after key are removed and added back. They
// are missing for an instant: a packet a peer encrypted with one of them
// as its primary may be dropped, and memberlist retransmits.
func removeKey(kr *memberlist.Keyring, key []byte) error {
	keys := slices.Clone(kr.GetKeys())
	if len(keys) > 0 && bytes.Equal(keys[0], key) {
		return errors.New("the primary key cannot be removed: use another key first")
	}
	idx := slices.IndexFunc(keys, func(k []byte) bool { return bytes.Equal(k, key) })
	if idx < 0 {
		return nil
	}
	for i := len(keys) - 1; i >= idx; i-- {
		if err := kr.RemoveKey(keys[i]); err != nil {
			return err
		}
	}
	for _, k := range keys[idx+1:] {
		if err := kr.AddKey(k); err != nil {
			return err
		}
	}
	return nil
}

// keyWorker applies the key operations other controllers send, one at a
// time, and answers them.
func (n *Node) keyWorker() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case m := <-n.keyOps:
			n.handleKeyOp(m)
		}
	}
}

const seenKeyOps = 256

func (n *Node) handleKeyOp(m keyOpMsg) {
	ack := keyAckMsg{ID: m.ID, From: n.cfg.NodeName}
	n.keyMu.Lock()
	if prev, seen := n.keySeen[m.ID]; seen {
		ack.Err = prev
	} else {
		if err := n.applyKeyOpLocked(m.Op, m.Key); err != nil {
			ack.Err = err.Error()
		}
		n.m.keyOps.WithLabelValues(string(m.Op.op()), resultLabel(nilIfEmpty(ack.Err))).Inc()
		if len(n.keySeenOrder) >= seenKeyOps {
			delete(n.keySeen, n.keySeenOrder[0])
			n.keySeenOrder = n.keySeenOrder[1:]
		}
		n.keySeen[m.ID] = ack.Err
		n.keySeenOrder = append(n.keySeenOrder, m.ID)
		if m.Op != keyOpList {
			n.log.Info("gossip keyring operation from the pool", "op", m.Op.op(), "key", fingerprint(m.Key), "from", m.From, "error", ack.Err)
		}
	}
	n.keyMu.Unlock()
	ack.Keys = n.ListKeys()
	n.mu.Lock()
	p := n.peers[m.From]
	var to memberlist.Node
	if p != nil && !p.dead {
		to = p.node
	}
	n.mu.Unlock()
	if to.Name == "" {
		n.log.Warn("keyring operation from an unknown controller not answered", "from", m.From)
		return
	}
	n.enqueue(sendJob{to: to, msg: ack.encode()})
}

func nilIfEmpty(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}

// deliverKeyAck hands an answer to the operation waiting for it.
func (n *Node) deliverKeyAck(a keyAckMsg) {
	n.mu.Lock()
	ch := n.keyWaits[a.ID]
	n.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- a:
	default:
	}
}

// keyringFile is the KeyringFile format.
type keyringFile struct {
	// Keys, base64, primary first.
	Keys []string `json:"keys"`
}

// loadKeyring returns the keys of cfg.KeyringFile if it exists, else of
// cfg.Keys (primary first).
func (c *Config) loadKeyring() (keys [][]byte, fromFile bool, err error) {
	if c.KeyringFile != "" {
		b, err := os.ReadFile(c.KeyringFile)
		switch {
		case err == nil:
			var f keyringFile
			if err := json.Unmarshal(b, &f); err != nil {
				return nil, true, fmt.Errorf("KeyringFile %s: %w", c.KeyringFile, err)
			}
			if len(f.Keys) == 0 {
				return nil, true, fmt.Errorf("KeyringFile %s holds no key", c.KeyringFile)
			}
			for i, k := range f.Keys {
				kb, err := decodeKey(k)
				if err != nil {
					return nil, true, fmt.Errorf("KeyringFile %s: key %d: %w", c.KeyringFile, i, err)
				}
				keys = append(keys, kb)
			}
			return keys, true, nil
		case !errors.Is(err, os.ErrNotExist):
			return nil, true, fmt.Errorf("KeyringFile: %w", err)
		}
	}
	keys, err = c.keys()
	return keys, false, err
}

// persistKeyring writes the keyring to KeyringFile (if set): a temporary
// file of mode 0600, renamed into place.
func (n *Node) persistKeyring() error {
	if n.cfg.KeyringFile == "" {
		return nil
	}
	var f keyringFile
	for _, k := range n.keyring.GetKeys() {
		f.Keys = append(f.Keys, base64.StdEncoding.EncodeToString(k))
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(n.cfg.KeyringFile), "."+filepath.Base(n.cfg.KeyringFile)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), n.cfg.KeyringFile)
}
