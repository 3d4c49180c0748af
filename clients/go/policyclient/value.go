package policyclient

import "context"

// DoValue runs fn through c.Do, as Do runs a function that returns only an
// error, and returns the value of the attempt that succeeded (the zero T
// when none did) with the Result. The error is Do's: non-nil only for
// misuse.
func DoValue[T any](ctx context.Context, c *Client, call Call, fn func(ctx context.Context, a Attempt) (T, error)) (T, Result, error) {
	var v T
	res, err := c.Do(ctx, call, func(ctx context.Context, a Attempt) error {
		got, err := fn(ctx, a)
		if err == nil {
			v = got
		}
		return err
	})
	return v, res, err
}
