"""The tau2 `airline` domain: flights, users and reservations; book, modify and cancel reservations.

Write semantics, following the domain policy (policy.md):

* The current time is 2024-05-15 15:00:00 EST: new reservations get `created_at = "2024-05-15T15:00:00"`.
* `book_reservation` prices every flight at its current price for the cabin, times the number of
  passengers, plus $30 per passenger for insurance and $50 per non-free bag, and requires the payments to add
  up to exactly that total. Payment methods must be in the user's profile; a gift card or certificate must
  cover its share. Gift cards are debited; a used travel certificate is removed from the profile (its
  remaining amount is not refundable). The booked seats are taken from each flight's availability. The new
  reservation id is the first free one of a fixed sequence (HATHAT, HATHAU, ...), so replays are deterministic.
* `cancel_reservation` marks the reservation cancelled and appends a refund (negative payment) for every
  payment in its history; money goes back to the original methods "within 5 to 7 business days", so no
  balance changes now.
* `update_reservation_flights` keeps the price of a segment that is kept (same flight, date and cabin) and
  prices new segments at the current price (taking their seats); the difference with what was paid for the
  old flights is charged to (or, if negative, refunded to) one gift card or credit card. Certificates cannot
  pay for changes.
* `update_reservation_baggages` charges $50 per added non-free bag to a gift card or credit card.
* `update_reservation_passengers` replaces the passengers; their number cannot change.
* `send_certificate` adds a travel certificate to the user's profile.

As the policy says, the rules an agent must check itself (24-hour / insurance / business cancellation rules,
basic economy flights cannot be modified, at most five passengers, payment method counts, no removal of bags,
...) are *not* enforced by the tools: an agent that breaks them changes the database the wrong way and is graded
accordingly. The tools only refuse what cannot be done at all (unknown ids, unavailable flights, not enough
seats or balance, payments that do not add up, a changed number of passengers, a second cancellation).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import string
from typing import Any, Literal, Union

from orchestra_jax.tau2.records import field
from orchestra_jax.tau2.tools import CalculateTool, ToolError, TransferTool, tool

CURRENT_TIME = "2024-05-15T15:00:00"
Cabin = Literal["basic_economy", "economy", "business"]
CABINS: tuple[str, ...] = ("basic_economy", "economy", "business")
INSURANCE_PRICE = 30
BAG_PRICE = 50

# City of each airport served (the database stores only IATA codes).
AIRPORT_CITIES = {
  "ATL": "Atlanta", "BOS": "Boston", "CLT": "Charlotte", "DEN": "Denver", "DFW": "Dallas-Fort Worth",
  "DTW": "Detroit", "EWR": "Newark", "IAH": "Houston", "JFK": "New York", "LAS": "Las Vegas",
  "LAX": "Los Angeles", "LGA": "New York", "MCO": "Orlando", "MIA": "Miami", "MSP": "Minneapolis",
  "ORD": "Chicago", "PHL": "Philadelphia", "PHX": "Phoenix", "SEA": "Seattle", "SFO": "San Francisco",
}


# --- records ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class FlightDateAvailable:
  status: Literal["available"]
  available_seats: dict[str, int]
  prices: dict[str, int]


@dataclasses.dataclass(kw_only=True)
class FlightDateLanded:
  status: Literal["landed"]
  actual_departure_time_est: str
  actual_arrival_time_est: str


@dataclasses.dataclass(kw_only=True)
class FlightDateCancelled:
  status: Literal["cancelled"]


@dataclasses.dataclass(kw_only=True)
class FlightDateScheduled:
  status: Literal["delayed", "on time"]
  estimated_departure_time_est: str
  estimated_arrival_time_est: str


@dataclasses.dataclass(kw_only=True)
class FlightDateFlying:
  status: Literal["flying"]
  actual_departure_time_est: str
  estimated_arrival_time_est: str


FlightDate = Union[FlightDateAvailable, FlightDateLanded, FlightDateCancelled, FlightDateScheduled,
                   FlightDateFlying]


@dataclasses.dataclass(kw_only=True)
class Flight:
  flight_number: str
  origin: str
  destination: str
  scheduled_departure_time_est: str
  scheduled_arrival_time_est: str  # "HH:MM:SS", with a "+1" suffix when it lands the next day
  dates: dict[str, FlightDate]


@dataclasses.dataclass(kw_only=True)
class Name:
  first_name: str
  last_name: str


@dataclasses.dataclass(kw_only=True)
class Address:
  address1: str
  address2: str
  city: str
  country: str
  state: str
  zip: str


@dataclasses.dataclass(kw_only=True)
class CreditCard:
  source: Literal["credit_card"]
  id: str
  brand: str
  last_four: str


@dataclasses.dataclass(kw_only=True)
class GiftCard:
  source: Literal["gift_card"]
  id: str
  amount: float


@dataclasses.dataclass(kw_only=True)
class Certificate:
  source: Literal["certificate"]
  id: str
  amount: float


PaymentMethod = Union[CreditCard, GiftCard, Certificate]


@dataclasses.dataclass(kw_only=True)
class Passenger:
  """A passenger."""
  first_name: str = field("The passenger's first name.")
  last_name: str = field("The passenger's last name.")
  dob: str = field("Date of birth, YYYY-MM-DD.")


@dataclasses.dataclass(kw_only=True)
class User:
  user_id: str
  name: Name
  address: Address
  email: str
  dob: str
  payment_methods: dict[str, PaymentMethod]
  saved_passengers: list[Passenger]
  membership: Literal["regular", "silver", "gold"]
  reservations: list[str]


@dataclasses.dataclass(kw_only=True)
class ReservationFlight:
  flight_number: str
  origin: str
  destination: str
  date: str
  price: int  # per passenger


@dataclasses.dataclass(kw_only=True)
class Payment:
  """A payment: which payment method pays how much."""
  payment_id: str = field("A payment method id from the user's profile, e.g. 'credit_card_7815826'.")
  amount: int = field("Amount in dollars (negative amounts are refunds).")


@dataclasses.dataclass(kw_only=True)
class Reservation:
  reservation_id: str
  user_id: str
  origin: str
  destination: str
  flight_type: Literal["one_way", "round_trip"]
  cabin: Cabin
  flights: list[ReservationFlight]
  passengers: list[Passenger]
  payment_history: list[Payment]
  created_at: str
  total_baggages: int
  nonfree_baggages: int
  insurance: Literal["yes", "no"]
  status: Literal["cancelled"] | None = None


@dataclasses.dataclass(kw_only=True)
class FlightInfo:
  """A flight on a date."""
  flight_number: str = field("Flight number, such as 'HAT001'.")
  date: str = field("Date of the flight, YYYY-MM-DD, such as '2024-05-01'.")


TABLES = {"flights": Flight, "users": User, "reservations": Reservation}

_ID_ALPHABET = string.ascii_uppercase + string.digits


def _next_id(first: str, taken) -> str:
  """The first id at or after `first` (counting in base 36 over A-Z0-9) that is not `taken`."""
  n = 0
  for ch in first:
    n = n * 36 + _ID_ALPHABET.index(ch)
  while True:
    digits, m = [], n
    for _ in first:
      digits.append(_ID_ALPHABET[m % 36])
      m //= 36
    candidate = "".join(reversed(digits))
    if candidate not in taken:
      return candidate
    n += 1


def _money(x: float) -> float:
  return round(x, 2)


# --- tools --------------------------------------------------------------------------------------------------
class AirlineTools(CalculateTool, TransferTool):
  """Tools of the airline domain."""

  # helpers
  def _user(self, user_id: str) -> User:
    user = self.db.get("users", user_id)
    if user is None:
      raise ToolError(f"User {user_id} not found")
    return user

  def _reservation(self, reservation_id: str) -> Reservation:
    res = self.db.get("reservations", reservation_id)
    if res is None:
      raise ToolError(f"Reservation {reservation_id} not found")
    return res

  def _flight(self, flight_number: str) -> Flight:
    flight = self.db.get("flights", flight_number)
    if flight is None:
      raise ToolError(f"Flight {flight_number} not found")
    return flight

  def _flight_date(self, flight_number: str, date: str) -> FlightDate:
    flight = self._flight(flight_number)
    if date not in flight.dates:
      raise ToolError(f"Flight {flight_number} not found on date {date}")
    return flight.dates[date]

  def _available(self, flight_number: str, date: str, cabin: str, seats: int) -> FlightDateAvailable:
    data = self._flight_date(flight_number, date)
    if not isinstance(data, FlightDateAvailable):
      raise ToolError(f"Flight {flight_number} not available on date {date} (status: {data.status})")
    if data.available_seats.get(cabin, 0) < seats:
      raise ToolError(f"Not enough seats on flight {flight_number} on {date} in {cabin}: "
                      f"{data.available_seats.get(cabin, 0)} left, {seats} needed")
    return data

  def _take_seats(self, flight_number: str, date: str, cabin: str, seats: int) -> None:
    flight = self.db.edit("flights", flight_number)
    flight.dates[date].available_seats[cabin] -= seats

  def _payment_for_update(self, user_id: str, payment_id: str, amount: int) -> Payment | None:
    """Charge (amount > 0) or refund (amount < 0) one gift card or credit card of the user."""
    user = self._user(user_id)
    method = user.payment_methods.get(payment_id)
    if method is None:
      raise ToolError(f"Payment method {payment_id} not found")
    if isinstance(method, Certificate):
      raise ToolError("Certificate cannot be used to update reservation")
    if isinstance(method, GiftCard) and method.amount < amount:
      raise ToolError(f"Gift card balance is not enough: {method.amount} available, {amount} needed")
    if isinstance(method, GiftCard) and amount != 0:
      card = self.db.edit("users", user_id).payment_methods[payment_id]
      card.amount = _money(card.amount - amount)
    return Payment(payment_id=payment_id, amount=amount) if amount != 0 else None

  @staticmethod
  def _direct(flight: Flight, date: str, data: FlightDateAvailable) -> dict[str, Any]:
    return {"flight_number": flight.flight_number, "origin": flight.origin, "destination": flight.destination,
            "status": data.status, "scheduled_departure_time_est": flight.scheduled_departure_time_est,
            "scheduled_arrival_time_est": flight.scheduled_arrival_time_est, "date": date,
            "available_seats": dict(data.available_seats), "prices": dict(data.prices)}

  # read tools
  @tool("Get the details of a user, including their profile, payment methods and reservations.",
        args={"user_id": "The user id, such as 'sara_doe_496'."})
  def get_user_details(self, user_id: str) -> User:
    return self._user(user_id)

  @tool("Get the details of a reservation.",
        args={"reservation_id": "The reservation id, such as '8JX2WO'."})
  def get_reservation_details(self, reservation_id: str) -> Reservation:
    return self._reservation(reservation_id)

  @tool("Search for direct flights between two cities on a specific date (only flights that can still be "
        "booked are listed).",
        args={"origin": "The origin city airport in three letters, such as 'JFK'.",
              "destination": "The destination city airport in three letters, such as 'LAX'.",
              "date": "The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'."})
  def search_direct_flight(self, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
    out = []
    for flight in self.db.rows("flights").values():
      if flight.origin == origin and flight.destination == destination:
        data = flight.dates.get(date)
        if isinstance(data, FlightDateAvailable):
          out.append(self._direct(flight, date, data))
    return out

  @tool("Search for one-stop flights between two cities on a specific date: pairs of flights where the "
        "second leg leaves the connecting airport after the first one lands (on the same day, or on the next "
        "day when the first leg lands after midnight).",
        args={"origin": "The origin city airport in three letters, such as 'JFK'.",
              "destination": "The destination city airport in three letters, such as 'LAX'.",
              "date": "The date of the first flight in the format 'YYYY-MM-DD', such as '2024-05-01'."})
  def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[dict[str, Any]]]:
    try:
      day = dt.date.fromisoformat(date)
    except ValueError:
      raise ToolError(f"Invalid date {date!r}: expected YYYY-MM-DD") from None
    flights = self.db.rows("flights")
    out = []
    for first in flights.values():
      if first.origin != origin or first.destination == destination:
        continue
      first_data = first.dates.get(date)
      if not isinstance(first_data, FlightDateAvailable):
        continue
      arrival = first.scheduled_arrival_time_est
      next_day = arrival.endswith("+1")
      arrival = arrival.removesuffix("+1")
      date2 = (day + dt.timedelta(days=1)).isoformat() if next_day else date
      for second in flights.values():
        if second.origin != first.destination or second.destination != destination:
          continue
        if second.scheduled_departure_time_est < arrival:
          continue
        second_data = second.dates.get(date2)
        if not isinstance(second_data, FlightDateAvailable):
          continue
        out.append([self._direct(first, date, first_data), self._direct(second, date2, second_data)])
    return out

  @tool("List all airports and their cities.")
  def list_all_airports(self) -> list[dict[str, str]]:
    codes = set()
    for flight in self.db.rows("flights").values():
      codes.update((flight.origin, flight.destination))
    return [{"iata": code, "city": AIRPORT_CITIES.get(code, "")} for code in sorted(codes)]

  @tool("Get the status of a flight on a date (available, on time, delayed, flying, landed or cancelled).",
        args={"flight_number": "The flight number, such as 'HAT001'.",
              "date": "The date of the flight in the format 'YYYY-MM-DD'."})
  def get_flight_status(self, flight_number: str, date: str) -> str:
    return self._flight_date(flight_number, date).status

  # write tools
  @tool("Book a reservation. The payments must add up to the total price: the current price of each flight in "
        "the cabin times the number of passengers, plus $30 per passenger for insurance and $50 per non-free "
        "checked bag.", writes=True,
        args={"user_id": "The id of the user booking the reservation, such as 'sara_doe_496'.",
              "origin": "The IATA code of the origin city, such as 'SFO'.",
              "destination": "The IATA code of the destination city, such as 'JFK'.",
              "flight_type": "The type of the trip.",
              "cabin": "The cabin class (the same for all flights).",
              "flights": "All flights of the reservation, in travel order (both directions for a round trip).",
              "passengers": "The passengers (at most five).",
              "payment_methods": "The payment methods used and the amount each pays; they must add up to the "
                                 "total price.",
              "total_baggages": "The total number of checked bags.",
              "nonfree_baggages": "The number of checked bags that are not free ($50 each).",
              "insurance": "Whether to buy travel insurance ($30 per passenger)."})
  def book_reservation(self, user_id: str, origin: str, destination: str,
                       flight_type: Literal["one_way", "round_trip"], cabin: Cabin, flights: list[FlightInfo],
                       passengers: list[Passenger], payment_methods: list[Payment], total_baggages: int,
                       nonfree_baggages: int, insurance: Literal["yes", "no"]) -> Reservation:
    user = self._user(user_id)
    if not flights:
      raise ToolError("A reservation needs at least one flight")
    if not passengers:
      raise ToolError("A reservation needs at least one passenger")
    if total_baggages < 0 or nonfree_baggages < 0 or nonfree_baggages > total_baggages:
      raise ToolError("Invalid baggage numbers: need 0 <= nonfree_baggages <= total_baggages")
    n = len(passengers)
    res_flights, total = [], 0
    for info in flights:
      data = self._available(info.flight_number, info.date, cabin, n)
      flight = self._flight(info.flight_number)
      price = data.prices[cabin]
      res_flights.append(ReservationFlight(flight_number=info.flight_number, origin=flight.origin,
                                           destination=flight.destination, date=info.date, price=price))
      total += price * n
    if insurance == "yes":
      total += INSURANCE_PRICE * n
    total += BAG_PRICE * nonfree_baggages

    if not payment_methods:
      raise ToolError("At least one payment method is needed")
    per_method: dict[str, int] = {}
    for payment in payment_methods:
      if payment.payment_id not in user.payment_methods:
        raise ToolError(f"Payment method {payment.payment_id} not found")
      if payment.amount < 0:
        raise ToolError(f"Payment amounts must not be negative ({payment.payment_id}: {payment.amount})")
      per_method[payment.payment_id] = per_method.get(payment.payment_id, 0) + payment.amount
    for payment_id, amount in per_method.items():
      method = user.payment_methods[payment_id]
      if isinstance(method, (GiftCard, Certificate)) and amount > method.amount:
        raise ToolError(f"Not enough balance in payment method {payment_id}: {method.amount} available, "
                        f"{amount} needed")
    paid = sum(p.amount for p in payment_methods)
    if paid != total:
      raise ToolError(f"Payment amount does not add up, total price is {total}, but paid {paid}")

    # All checks passed: charge, take the seats, store the reservation.
    editable_user = self.db.edit("users", user_id)
    for payment_id, amount in per_method.items():
      method = editable_user.payment_methods[payment_id]
      if isinstance(method, GiftCard):
        method.amount = _money(method.amount - amount)
      elif isinstance(method, Certificate):
        del editable_user.payment_methods[payment_id]
    for info in flights:
      self._take_seats(info.flight_number, info.date, cabin, n)
    reservation_id = _next_id("HATHAT", self.db.rows("reservations"))
    reservation = Reservation(
      reservation_id=reservation_id, user_id=user_id, origin=origin, destination=destination,
      flight_type=flight_type, cabin=cabin, flights=res_flights, passengers=passengers,
      payment_history=[Payment(payment_id=p.payment_id, amount=p.amount) for p in payment_methods],
      created_at=CURRENT_TIME, total_baggages=total_baggages, nonfree_baggages=nonfree_baggages,
      insurance=insurance)
    self.db.put("reservations", reservation_id, reservation)
    editable_user.reservations.append(reservation_id)
    return reservation

  @tool("Cancel the whole reservation. Every payment is refunded to its original payment method (within 5 to 7 "
        "business days).", writes=True,
        args={"reservation_id": "The reservation id, such as 'ZFA04Y'."})
  def cancel_reservation(self, reservation_id: str) -> Reservation:
    res = self._reservation(reservation_id)
    if res.status == "cancelled":
      raise ToolError(f"Reservation {reservation_id} is already cancelled")
    res = self.db.edit("reservations", reservation_id)
    refunds = [Payment(payment_id=p.payment_id, amount=-p.amount) for p in res.payment_history]
    res.payment_history.extend(refunds)
    res.status = "cancelled"
    return res

  @tool("Update the flights (and/or the cabin) of a reservation. Segments kept unchanged (same flight, date "
        "and cabin) keep their original price; new segments are priced now. The price difference is charged "
        "to, or refunded to, the given payment method.", writes=True,
        args={"reservation_id": "The reservation id, such as 'ZFA04Y'.",
              "cabin": "The cabin class of the reservation after the change.",
              "flights": "ALL flights of the reservation after the change, kept and new ones, in travel order.",
              "payment_id": "A gift card or credit card id from the user's profile, such as "
                            "'credit_card_7815826', to pay or receive the price difference."})
  def update_reservation_flights(self, reservation_id: str, cabin: Cabin, flights: list[FlightInfo],
                                 payment_id: str) -> Reservation:
    res = self._reservation(reservation_id)
    if not flights:
      raise ToolError("A reservation needs at least one flight")
    n = len(res.passengers)
    new_flights, to_take, total = [], [], 0
    for info in flights:
      kept = None
      if cabin == res.cabin:
        kept = next((f for f in res.flights if f.flight_number == info.flight_number and f.date == info.date),
                    None)
      if kept is not None:
        new_flights.append(ReservationFlight(**vars(kept)))
        total += kept.price * n
        continue
      data = self._available(info.flight_number, info.date, cabin, n)
      flight = self._flight(info.flight_number)
      new_flights.append(ReservationFlight(flight_number=info.flight_number, origin=flight.origin,
                                           destination=flight.destination, date=info.date,
                                           price=data.prices[cabin]))
      to_take.append(info)
      total += data.prices[cabin] * n
    total -= sum(f.price for f in res.flights) * n
    payment = self._payment_for_update(res.user_id, payment_id, total)
    for info in to_take:
      self._take_seats(info.flight_number, info.date, cabin, n)
    res = self.db.edit("reservations", reservation_id)
    if payment is not None:
      res.payment_history.append(payment)
    res.flights = new_flights
    res.cabin = cabin
    return res

  @tool("Update the baggage information of a reservation. Each added non-free bag costs $50, paid with the "
        "given payment method.", writes=True,
        args={"reservation_id": "The reservation id, such as 'ZFA04Y'.",
              "total_baggages": "The updated total number of checked bags.",
              "nonfree_baggages": "The updated number of non-free checked bags.",
              "payment_id": "A gift card or credit card id from the user's profile, such as "
                            "'credit_card_7815826'."})
  def update_reservation_baggages(self, reservation_id: str, total_baggages: int, nonfree_baggages: int,
                                  payment_id: str) -> Reservation:
    res = self._reservation(reservation_id)
    if total_baggages < 0 or nonfree_baggages < 0 or nonfree_baggages > total_baggages:
      raise ToolError("Invalid baggage numbers: need 0 <= nonfree_baggages <= total_baggages")
    price = BAG_PRICE * max(0, nonfree_baggages - res.nonfree_baggages)
    payment = self._payment_for_update(res.user_id, payment_id, price)
    res = self.db.edit("reservations", reservation_id)
    if payment is not None:
      res.payment_history.append(payment)
    res.total_baggages = total_baggages
    res.nonfree_baggages = nonfree_baggages
    return res

  @tool("Update the passenger information of a reservation (the number of passengers cannot change).",
        writes=True,
        args={"reservation_id": "The reservation id, such as 'ZFA04Y'.",
              "passengers": "All passengers of the reservation after the update."})
  def update_reservation_passengers(self, reservation_id: str, passengers: list[Passenger]) -> Reservation:
    res = self._reservation(reservation_id)
    if len(passengers) != len(res.passengers):
      raise ToolError(f"Number of passengers does not match: the reservation has {len(res.passengers)}, "
                      f"got {len(passengers)}")
    res = self.db.edit("reservations", reservation_id)
    res.passengers = passengers
    return res

  @tool("Send a travel certificate of the given amount to a user (as compensation).", writes=True,
        args={"user_id": "The id of the user, such as 'sara_doe_496'.",
              "amount": "The certificate amount in dollars."})
  def send_certificate(self, user_id: str, amount: float) -> str:
    user = self._user(user_id)
    if amount <= 0:
      raise ToolError("The certificate amount must be positive")
    n = 3221322
    while f"certificate_{n}" in user.payment_methods:
      n += 1
    cert_id = f"certificate_{n}"
    self.db.edit("users", user_id).payment_methods[cert_id] = Certificate(source="certificate", id=cert_id,
                                                                          amount=_money(amount))
    shown = int(amount) if float(amount).is_integer() else amount
    return f"Certificate {cert_id} added to user {user_id} with amount {shown}."
