package envoy

// entry is one key and value of a descriptor.
type entry struct{ key, value string }
