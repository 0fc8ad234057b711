package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
)

// MaxTags bounds a run's tags (StartOpts.Tags) and a list's tag filter.
const MaxTags = 20

// tagKey is what a tag's key may be: a name for people and for query
// strings, "key=value" and "key:value" splitting at its first = or :.
var tagKey = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// checkTags validates tags (what names them in errors: "StartOpts.Tags")
// and returns them as the JSON object stored (nil for none). Errors wrap
// ErrInvalidArgument.
func checkTags(what string, tags map[string]string) ([]byte, error) {
	if len(tags) == 0 {
		return nil, nil
	}
	if len(tags) > MaxTags {
		return nil, fmt.Errorf("%w: %s has %d tags; at most %d", ErrInvalidArgument, what, len(tags), MaxTags)
	}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		if !tagKey.MatchString(k) {
			return nil, fmt.Errorf("%w: %s: tag key %q must be 1 to 64 of A-Z a-z 0-9 _ . -", ErrInvalidArgument, what, truncateText(k, 64))
		}
		if err := checkName("tag "+k+"'s value", tags[k], 256); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidArgument, what, err)
		}
	}
	b, err := json.Marshal(tags)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidArgument, what, err)
	}
	return b, nil
}

// decodeTags reads stored tags (nil for none).
func decodeTags(b []byte) map[string]string {
	if len(b) == 0 {
		return nil
	}
	var m map[string]string
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}
