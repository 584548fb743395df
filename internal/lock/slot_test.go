package lock

import "testing"

// TestHashSlotIsRedisClusters: the slots that a redis-server 7.0.15 in
// cluster mode gives for these keys (CLUSTER KEYSLOT), with and without hash
// tags, an empty tag (the whole key counts) and nested braces.
func TestHashSlotIsRedisClusters(t *testing.T) {
	for key, want := range map[string]int{
		"foo":                  12182,
		"somekey":              11058,
		"hello":                866,
		"{user1000}.following": 3443,
		"foo{}{bar}":           8363,
		"foo{{bar}}zap":        4015,
		"lockstep:{foo}":       12182,
		"x{foo}:fence":         12182,
	} {
		if got := hashSlot(key); got != want {
			t.Errorf("hashSlot(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestSlotTagsNameTheirSlots: each slot's tag hashes to that slot, so a
// floor named with it shares the slot of the resources it serves.
func TestSlotTagsNameTheirSlots(t *testing.T) {
	tags := slotTags()
	for slot, tag := range tags {
		if tag == "" || hashSlot("lockstep:fences:{"+tag+"}") != slot {
			t.Fatalf("slot %d: tag %q hashes to %d", slot, tag, hashSlot("{"+tag+"}"))
		}
	}
	l := &Locker{prefix: "lockstep:"}
	for _, r := range []string{"order:1", "tenant:t2", "a{b}c", "", "schedule:nightly"} {
		k := l.keysFor(r)
		if hashSlot(k.floor) != hashSlot(k.lock) {
			t.Errorf("resource %q: floor %s in slot %d, lock %s in %d", r, k.floor, hashSlot(k.floor), k.lock, hashSlot(k.lock))
		}
	}
}
