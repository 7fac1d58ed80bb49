// Package memprofile reads the runtime's memory profile for tests that
// bound what one part of the program allocates or keeps: they set
// runtime.MemProfileRate to 1 before the allocations and sum the records
// whose allocating stack passes through that part.
package memprofile

import "runtime"

// Records returns every record of the memory profile as of a collection
// that finished after the call began (the profile is as of the last
// completed cycle, so two run first).
func Records() []runtime.MemProfileRecord {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, true)
		if ok {
			return recs[:n]
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
}

// Sum adds up the in-use bytes and the allocated objects of the records
// whose stack keep accepts.
func Sum(keep func(stack []uintptr) bool) (inUseBytes, allocObjects int64) {
	for _, r := range Records() {
		if keep(r.Stack()) {
			inUseBytes += r.InUseBytes()
			allocObjects += r.AllocObjects
		}
	}
	return inUseBytes, allocObjects
}
