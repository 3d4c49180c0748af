package statuspage

// SampleNow takes one sample for the sparklines, as the sampler does every
// Config.Sample, so tests need not wait for its ticker.
func (p *Page) SampleNow() { p.sample() }
