// The client's hand-written lists against the service's own /openapi.json
// (tests/typescript/run.sh starts the service): an event type added to the
// service, or renamed, fails here before a kiosk meets it.
import assert from "node:assert/strict";
import { test } from "node:test";

import { EVENT_TYPES } from "../dist/index.js";
import { serviceUrl } from "./service.mjs";

test("models: the event types are the document's", async () => {
  const response = await fetch(`${serviceUrl}/openapi.json`);
  assert.equal(response.status, 200);
  const document = await response.json();
  const schemas = document.components.schemas;
  const union = schemas.EventView;
  const listed = union.oneOf.map((variant) => {
    const schema = schemas[variant.$ref.split("/").pop()];
    assert.equal(schema.properties.type.enum.length, 1);
    return schema.properties.type.enum[0];
  });
  assert.deepEqual([...listed].sort(), Object.keys(union.discriminator.mapping).sort());
  assert.deepEqual([...EVENT_TYPES].sort(), [...listed].sort());
  assert.equal(new Set(EVENT_TYPES).size, EVENT_TYPES.length);
});
