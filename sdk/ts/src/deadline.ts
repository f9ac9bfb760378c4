// A call's timeout and AbortSignal, shared by the transport's call queue (transport.ts) and the
// Stream calls (stream.ts): both end a wait with the SignerError a unary call gives for the same
// event.

import { Code, ConnectError } from "@connectrpc/connect";

import { toSignerError, type SignerError } from "./errors.js";

/** Deadline is one call's timeout and AbortSignal. */
export class Deadline {
  private readonly end: number;
  private err: SignerError | undefined;
  private readonly listeners: ((err: SignerError) => void)[] = [];
  private readonly timer: ReturnType<typeof setTimeout> | undefined;
  private readonly onAbort: (() => void) | undefined;

  constructor(
    timeoutMs: number,
    private readonly signal: AbortSignal | undefined,
  ) {
    // Wall time, not SignerCallsOptions.now: the timer that ends the wait is a real one. A
    // timeout of 0 or less is none, as for a Connect call.
    this.end = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
    // The unary call's errors for the same events.
    this.timer =
      timeoutMs > 0 ? setTimeout(() => this.fire(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs) : undefined;
    if (signal !== undefined) {
      this.onAbort = () => this.fire(signal.reason);
      if (signal.aborted) {
        this.fire(signal.reason);
      } else {
        signal.addEventListener("abort", this.onAbort, { once: true });
      }
    }
  }

  private fire(reason: unknown): void {
    if (this.err !== undefined) {
      return;
    }
    this.err = toSignerError(reason);
    for (const l of this.listeners.splice(0)) {
      l(this.err);
    }
  }

  /** error is why the call stopped waiting; a DeadlineExceeded when it has not (yet). */
  error(): SignerError {
    return this.err ?? toSignerError(new ConnectError("the operation timed out", Code.DeadlineExceeded));
  }

  /** ended reports whether the call has stopped waiting (timed out or aborted). */
  ended(): boolean {
    return this.err !== undefined;
  }

  remainingMs(): number {
    return this.err !== undefined ? 0 : this.end - Date.now();
  }

  /** onEnd calls fn when the call stops waiting (at once if it has). */
  onEnd(fn: (err: SignerError) => void): void {
    if (this.err !== undefined) {
      fn(this.err);
      return;
    }
    this.listeners.push(fn);
  }

  /** race resolves as p does, or rejects when the call stops waiting first. */
  race<T>(p: Promise<T>): Promise<T> {
    return new Promise((resolve, reject) => {
      this.onEnd(reject);
      p.then(resolve, reject);
    });
  }

  dispose(): void {
    clearTimeout(this.timer);
    if (this.onAbort !== undefined) {
      this.signal?.removeEventListener("abort", this.onAbort);
    }
    this.listeners.length = 0;
  }
}
