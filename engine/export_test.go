package engine

// FreeWorkers is how many of e's MaxWorkers slots are free now, for tests
// that must not start a run before a finished delivery has given its slot
// back: Wait returns when the run's end commits, a moment before its
// delivery returns and frees the slot.
func FreeWorkers(e *Engine) int { return cap(e.slots) - len(e.slots) }
