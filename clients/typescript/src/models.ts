/**
 * What the service answers, as the wire has it (snake_case, as in
 * /openapi.json). tests check these against the service's document.
 */

export type JobStatus = "queued" | "running" | "succeeded" | "failed";
export type ReservationState = "held" | "committed" | "released" | "expired";
export type AccountStatus = "active" | "suspended";

export const JOB_TERMINAL_STATUSES: readonly JobStatus[] = ["succeeded", "failed"];

export interface JobReservation {
  reservation_id: string;
  state: ReservationState;
  expires_at: string;
}

/** What a succeeded job produced: the provider's `output` (any JSON). */
export interface JobResult {
  output: unknown;
  provider_job_id?: string;
  [member: string]: unknown;
}

/** Why a failed job failed (its tokens went back). */
export interface JobError {
  code: string;
  message: string;
  [member: string]: unknown;
}

export interface Job {
  job_id: string;
  request_id: string;
  account_id: string;
  kind: string;
  status: JobStatus;
  cost: number;
  attempts: number;
  reservation: JobReservation;
  result: JobResult | null;
  error: JobError | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
}

export interface Balance {
  account_id: string;
  name: string;
  status: AccountStatus;
  available: number;
  reserved: number;
  used: number;
  [member: string]: unknown;
}

export interface Event {
  id: string;
  type: string;
  created_at: string;
  data: Record<string, unknown>;
}

export function isTerminal(job: Job): boolean {
  return JOB_TERMINAL_STATUSES.includes(job.status);
}
