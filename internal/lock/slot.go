package lock

import (
	"strconv"
	"sync"
)

// A Cluster slot's fence floor: see keys.floor and lua/lib.lua's retire.
// The floor of resource R must hash to R's slot, so that one script reaches
// both; its name carries a short tag of that slot instead of {R}, so that all
// the resources of a slot share it and a released resource keeps no key.

// hashSlot is Redis Cluster's slot of key: CRC16 (XMODEM) of its hash tag
// (the part between the first "{" and the next "}", when not empty), else of
// the whole key, modulo 16384.
func hashSlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return int(crc16(key) & 16383)
				}
			}
			break
		}
	}
	return int(crc16(key) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), as Redis Cluster uses.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// slotTags holds, for each of the 16384 slots, a short string whose slot it
// is: the base-36 numbers from 0 up cover every slot within some 180,000
// tries (a few milliseconds, once per process).
var slotTags = sync.OnceValue(func() *[16384]string {
	var tags [16384]string
	left := len(tags)
	for i := uint64(0); left > 0; i++ {
		s := strconv.FormatUint(i, 36)
		if slot := crc16(s) & 16383; tags[slot] == "" {
			tags[slot] = s
			left--
		}
	}
	return &tags
})
