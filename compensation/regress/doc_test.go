// Package regress_test holds regression tests for faults found by attacking
// sagas, cancellation, activities and tx steps: lost commit replies,
// cancellations racing commits, suspensions and in-flight calls, garbage
// error classes, and misuse of Compensate.
package regress_test
